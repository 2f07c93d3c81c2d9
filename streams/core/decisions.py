"""What the control core decides: plain data for its driver to carry out.

The live shell turns each decision into Kafka records (``streams/core/avro_edge.py``); the
simulator turns them into simulated work. Nothing here does anything by itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phaseroute.schemas.enums import JobEventKind
from phaseroute.streams.policy import RequestWork

from .events import Event, RequestQueued


@dataclass(frozen=True, slots=True)
class QueueRequest:
    """Admission's output: put the admitted request on ``requests.pending`` (the shell adds the
    text of prompt ``prompt_index`` of the job)."""

    request: RequestQueued
    prompt_index: int


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Send attempt ``attempt`` of the request to ``prefill_pool`` (decode on ``decode_pool``)."""

    work: RequestWork
    custom_id: str
    priority: int
    attempt: int
    prefill_pool: str
    decode_pool: str
    colocated: bool
    speculative: bool
    explored: bool


@dataclass(frozen=True, slots=True)
class FailRequest:
    """Send the request's final failed result (it ends when the result is read back)."""

    work: RequestWork
    custom_id: str
    attempt: int
    reason: str
    code: str  # machine-readable: request_failed, no_placement, batch_cancelled, batch_expired, internal_error


@dataclass(frozen=True, slots=True)
class JobChanged:
    """The job's state (``job``: its record at this moment) for ``jobs.events`` / ``jobs.state``."""

    job: dict[str, Any]
    kind: JobEventKind
    reason: str | None = None
    earliest_feasible_deadline: float | None = None
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Forget:
    """The job is finished and its output whole: drop what the driver keeps for these requests."""

    job_id: str
    request_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Problem:
    """Handling ``event`` (None: one request in a tick) raised; the rest went on. The shell logs it
    and dead-letters the event."""

    where: str
    reason: str
    event: Event | None = None


Decision = QueueRequest | Dispatch | FailRequest | JobChanged | Forget | Problem
