"""Life cycles of jobs and request attempts, and the deterministic attempt id.

A job moves SUBMITTED -> ADMITTED or REJECTED -> RUNNING -> COMPLETED / FAILED / CANCELLED /
EXPIRED: ``phaseroute.schemas.enums.JobState`` is the one definition (ordered by stage);
``job_transition_error`` says which moves are legal.

An attempt (one try of one phase of one request on one pool) moves QUEUED -> WAITING_FOR_KV
(decode only, until the KV blob is ready) -> RUNNING -> SUCCEEDED / FAILED / CANCELLED /
SUPERSEDED (a speculative copy finished first). Attempt numbers count across the request's
whole life (both phases), so ``attempt_id`` is unique per request and a replay of the same
attempt overwrites instead of duplicating.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

from phaseroute.schemas import ids
from phaseroute.schemas.enums import JobState

from .types import Phase


class AttemptStatus(IntEnum):
    QUEUED = 0
    WAITING_FOR_KV = 5
    RUNNING = 10
    SUCCEEDED = 20
    FAILED = 21
    CANCELLED = 22
    SUPERSEDED = 23

    @property
    def is_finished(self) -> bool:
        return self >= AttemptStatus.SUCCEEDED


class FailureKind(StrEnum):
    """Why an attempt failed; decides whether and where it is retried."""

    ERROR = "error"  # the worker raised; retry the same phase elsewhere
    KV_CHECKSUM = "kv_checksum"  # the KV blob is corrupt; prefill again
    WORKER_DEATH = "worker_death"  # the worker vanished mid-attempt
    POOL_LOST = "pool_lost"  # the pool's heartbeats stopped
    TIMEOUT = "timeout"  # the attempt ran past its limit
    INVALID = "invalid"  # the input cannot run anywhere; never retried

    @property
    def retryable(self) -> bool:
        return self is not FailureKind.INVALID


_JOB_MOVES: dict[JobState, frozenset[JobState]] = {
    JobState.SUBMITTED: frozenset({JobState.ADMITTED, JobState.REJECTED, JobState.CANCELLED}),
    JobState.ADMITTED: frozenset({JobState.RUNNING, JobState.FAILED, JobState.CANCELLED, JobState.EXPIRED}),
    JobState.RUNNING: frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.EXPIRED}),
}


def job_transition_error(old: JobState, new: JobState) -> str | None:
    """None when ``old -> new`` is a legal move, else why not."""
    if old is new:
        return None  # replays are idempotent
    if old.is_finished:
        return f"job is already {old.name}; cannot become {new.name}"
    if new not in _JOB_MOVES.get(old, frozenset()):
        return f"job cannot move from {old.name} to {new.name}"
    return None


_SEP = "/"
_BY_SLUG = {phase.slug: phase for phase in Phase}


def attempt_id(request_id: str, phase: Phase, attempt: int) -> str:
    """Deterministic id of one attempt, ``<request_id>/<phase>/<attempt>`` (the format the
    messages carry: built by :func:`phaseroute.schemas.ids.attempt_id`, the one definition)."""
    if not request_id:
        raise ValueError("attempt_id: request_id must be non-empty, got ''")
    return ids.attempt_id(request_id, phase.slug, attempt)


def parse_attempt_id(value: str) -> tuple[str, Phase, int]:
    """Inverse of :func:`attempt_id` (request ids may themselves contain ':')."""
    parts = value.rsplit(_SEP, 2)
    try:
        request_id, phase, attempt = parts
        return request_id, _BY_SLUG[phase], int(attempt)
    except (ValueError, KeyError):
        raise ValueError(f"{value!r} is not an attempt id '<request_id>/<prefill|decode>/<n>'") from None
