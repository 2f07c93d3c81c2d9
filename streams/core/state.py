"""The control core's state of requests, their attempts and jobs, and its persisted form.

A request's status is one ordered enum (``RequestStatus``; ``is_finished`` is ``>= DONE``):

    QUEUED  (in its tenant's fair queue)  --released, placed-->  RUNNING (>= 1 live attempt)
    QUEUED  --no pool can place it-->  BACKOFF (until ``retry_at``) --> QUEUED
    RUNNING --attempt failed, retryable-->  BACKOFF --> QUEUED
    RUNNING --pool lost-->  QUEUED (at once, away from the dead pool)
    any open status --gave up / job cancelled or expired-->  FAILING (its final failed result is
        sent; the status holds until that result is read back from ``results``)
    RUNNING | FAILING --the first result for the request is read-->  DONE | FAILED

An attempt is one dispatch of the request to a path (prefill pool, decode pool; colocated when
equal). Its phase moves PREFILL -> DECODE when its KV is ready; a colocated attempt stays in
PREFILL until its result (its expected duration covers both phases). A straggler gets one
speculative attempt beside it; the first result wins.

The persisted form (``to_record`` / ``from_record``) holds plain JSON values only, with enums
by name: it is what the Faust shell writes into its changelog-backed tables and what a restarted
core is rebuilt from. The prompt text is not part of it (the shell stores it once).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from phaseroute.schemas.enums import JobState, Phase, QualityTier
from phaseroute.streams.policy import RequestWork


class RequestStatus(IntEnum):
    QUEUED = 0
    BACKOFF = 1
    RUNNING = 10
    FAILING = 20
    DONE = 30
    FAILED = 31

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.DONE

    @property
    def is_open(self) -> bool:
        """Still to be run or running: the job's backlog counts it."""
        return self < RequestStatus.FAILING


@dataclass(slots=True, eq=False)
class Attempt:
    """One dispatch of a request; ``number`` is unique within the request (attempt ids)."""

    number: int
    prefill_pool: str
    decode_pool: str
    colocated: bool
    phase: Phase
    started_at: float  # when the current phase started (dispatch, or KV ready)
    speculative: bool = False
    kv_at: str | None = None  # where its KV lives once ready: a pool name or the KV store
    wait_s: float = 0.0  # queueing the router expected before the current phase runs
    decode_wait_s: float = 0.0  # queueing the router expected at the decode pool

    @property
    def expected_start(self) -> float:
        """When the current phase should start running (the straggler clock starts here)."""
        return self.started_at + self.wait_s

    @property
    def pool(self) -> str:
        """The pool the attempt occupies now."""
        return self.decode_pool if self.phase is Phase.DECODE else self.prefill_pool

    def to_record(self) -> dict[str, Any]:
        return {"number": self.number, "prefill_pool": self.prefill_pool, "decode_pool": self.decode_pool,
                "colocated": self.colocated, "phase": self.phase.name, "started_at": self.started_at,
                "speculative": self.speculative, "kv_at": self.kv_at, "wait_s": self.wait_s,
                "decode_wait_s": self.decode_wait_s}

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> Attempt:
        return cls(int(r["number"]), str(r["prefill_pool"]), str(r["decode_pool"]), bool(r["colocated"]),
                   Phase[r["phase"]], float(r["started_at"]), bool(r["speculative"]), r["kv_at"], float(r["wait_s"]),
                   float(r["decode_wait_s"]))


@dataclass(frozen=True, slots=True)
class PastAttempt:
    """An attempt that failed, as the retry rules need it (``policy.next_step``)."""

    number: int
    phase: Phase
    pool: str
    started_at: float
    ended_at: float
    failure: str  # a FailureKind value
    detail: str
    kv_lost: bool

    def to_record(self) -> dict[str, Any]:
        return {"number": self.number, "phase": self.phase.name, "pool": self.pool, "started_at": self.started_at,
                "ended_at": self.ended_at, "failure": self.failure, "detail": self.detail, "kv_lost": self.kv_lost}

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> PastAttempt:
        return cls(int(r["number"]), Phase[r["phase"]], str(r["pool"]), float(r["started_at"]), float(r["ended_at"]),
                   str(r["failure"]), str(r["detail"]), bool(r["kv_lost"]))


@dataclass(slots=True)
class RequestState:
    """Everything the core knows of one request (no prompt text)."""

    work: RequestWork  # id, job, tenant, model, sizes, deadline, quality; avoid_pools of the next try
    custom_id: str
    priority: int
    status: RequestStatus = RequestStatus.QUEUED
    attempts: list[Attempt] = field(default_factory=list)  # live ones
    failures: list[PastAttempt] = field(default_factory=list)
    next_attempt: int = 0  # number of the next dispatch
    retry_at: float | None = None  # BACKOFF: when it is queued again
    unplaced_since: float | None = None  # the first of the current run of "no pool can place it"
    unplaced_tries: int = 0
    final_reason: str | None = None  # FAILING / FAILED: why
    final_code: str | None = None  # FAILING / FAILED: machine-readable reason (batch_cancelled, ...)
    pin: tuple[str, str] | None = None  # placed on this (prefill, decode) path only: a drift canary

    @property
    def request_id(self) -> str:
        return self.work.request_id

    @property
    def job_id(self) -> str:
        return self.work.job_id

    def attempt(self, number: int) -> Attempt | None:
        for a in self.attempts:
            if a.number == number:
                return a
        return None

    def to_record(self) -> dict[str, Any]:
        w = self.work
        return {
            "job_id": w.job_id, "tenant": w.tenant, "model": w.model, "custom_id": self.custom_id,
            "prompt_tokens": w.prompt_tokens, "max_tokens": w.max_output_tokens, "deadline": w.deadline,
            "quality_tier": w.quality_tier.name, "quality_tolerance": w.quality_tolerance, "priority": self.priority,
            "avoid": sorted(w.avoid_pools), "status": self.status.name,
            "attempts": [a.to_record() for a in self.attempts], "failures": [f.to_record() for f in self.failures],
            "next_attempt": self.next_attempt, "retry_at": self.retry_at, "unplaced_since": self.unplaced_since,
            "unplaced_tries": self.unplaced_tries, "final_reason": self.final_reason, "final_code": self.final_code,
            "pin": list(self.pin) if self.pin else None,
        }

    @classmethod
    def from_record(cls, request_id: str, r: dict[str, Any]) -> RequestState:
        work = RequestWork(
            request_id, str(r["job_id"]), str(r["tenant"]), str(r["model"]), int(r["prompt_tokens"]),
            int(r["max_tokens"]), None if r["deadline"] is None else float(r["deadline"]),
            QualityTier[r["quality_tier"]], float(r["quality_tolerance"]), int(r["next_attempt"]),
            frozenset(r["avoid"]),
        )
        return cls(
            work, str(r["custom_id"]), int(r["priority"]), RequestStatus[r["status"]],
            [Attempt.from_record(a) for a in r["attempts"]], [PastAttempt.from_record(f) for f in r["failures"]],
            int(r["next_attempt"]), r["retry_at"], r["unplaced_since"], int(r["unplaced_tries"]), r["final_reason"],
            r["final_code"], (str(r["pin"][0]), str(r["pin"][1])) if r.get("pin") else None,
        )


@dataclass(slots=True)
class JobRecord:
    """One job as the core tracks it; ``to_record`` is what ``jobs.state`` events are built from."""

    job_id: str
    tenant: str
    model: str
    priority: int
    submitted_at: float
    deadline: float | None
    quality_tier: QualityTier
    state: JobState = JobState.SUBMITTED
    requests_total: int = 0
    done: int = 0
    failed: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    lines_written: int = 0
    estimated_completion: float | None = None
    finished_at: float | None = None
    reason: str | None = None  # the latest verdict or final reason, kept for a resubmitted id
    submissions: int = 1  # how many times this id was submitted and judged (a rejected id may come back)
    prefill_left: int = 0  # prompt tokens of its open requests (the admission backlog)
    decode_left: int = 0  # output caps of its open requests

    @property
    def finished_requests(self) -> int:
        return self.done + self.failed

    @property
    def deadline_missed(self) -> bool:
        return bool(self.state.is_finished and self.finished_at is not None and self.deadline is not None
                    and self.finished_at > self.deadline)

    def to_record(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id, "tenant": self.tenant, "model": self.model, "priority": self.priority,
            "submitted_at": self.submitted_at, "deadline": self.deadline, "quality_tier": self.quality_tier.name,
            "state": self.state.name, "requests_total": self.requests_total, "done": self.done, "failed": self.failed,
            "tokens_in": self.tokens_in, "tokens_out": self.tokens_out, "lines_written": self.lines_written,
            "estimated_completion": self.estimated_completion, "finished_at": self.finished_at, "reason": self.reason,
            "submissions": self.submissions, "prefill_left": self.prefill_left, "decode_left": self.decode_left,
        }

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> JobRecord:
        return cls(
            str(r["job_id"]), str(r["tenant"]), str(r["model"]), int(r["priority"]), float(r["submitted_at"]),
            None if r["deadline"] is None else float(r["deadline"]), QualityTier[r["quality_tier"]],
            JobState[r["state"]], int(r["requests_total"]), int(r["done"]), int(r["failed"]), int(r["tokens_in"]),
            int(r["tokens_out"]), int(r["lines_written"]), r["estimated_completion"], r["finished_at"], r["reason"],
            int(r["submissions"]), int(r["prefill_left"]), int(r["decode_left"]),
        )
