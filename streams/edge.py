"""The Avro edge of the control plane: decoded Kafka records <-> the control core's typed events
and decisions. Explicit converters, one per message kind; times are epoch milliseconds on the
wire and epoch seconds in the core; enums travel by their Avro symbols (the one definition in
``phaseroute.schemas.enums``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phaseroute.infra import topics
from phaseroute.schemas.enums import JobCommandKind, JobState, Phase, QualityTier
from phaseroute.schemas.ids import attempt_id, job_event_id
from phaseroute.streams.core import (
    AttemptFailed,
    CancelRequested,
    Dispatch,
    FailRequest,
    JobChanged,
    JobEnded,
    JobSubmitted,
    KvReady,
    OutputWritten,
    PromptSize,
    RequestQueued,
    ResultReceived,
)
from phaseroute.streams.policy import FailureKind

KV_STORE = "kvstore"  # where a live prefill leaves its KV: the shared KV store, not the pool


@dataclass(frozen=True)
class Send:
    """One message for the Faust layer to send: topic, key, Avro kind, record, and the partition
    when the sender chose one (pool work, ``pool_partitions.py``; else the key's hash decides)."""

    topic: str
    key: str
    kind: str
    record: dict[str, Any]
    partition: int | None = None


def ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def seconds(value: int | float | None) -> float | None:
    return None if value is None else float(value) / 1000.0


# -- records -> events ------------------------------------------------------------------------
def job_submitted(record: dict[str, Any], prompts: list[PromptSize], intake_error: str | None) -> JobSubmitted:
    return JobSubmitted(
        job_id=str(record["job_id"]), tenant=str(record["tenant"]), model=str(record["model"]),
        priority=int(record["priority"]), submitted_at=float(record["submitted_at"]) / 1000.0,
        deadline=seconds(record["deadline"]), quality_tier=QualityTier(record["quality_tier"]),
        quality_tolerance=float(record.get("quality_tolerance") or 0.0),
        temperature=float(record["sampling"].get("temperature", 0.0)), prompts=tuple(prompts),
        intake_error=intake_error,
    )


def request_queued(record: dict[str, Any]) -> RequestQueued:
    pre, dec = record.get("pinned_prefill_pool"), record.get("pinned_decode_pool")
    return RequestQueued(
        request_id=str(record["request_id"]), job_id=str(record["job_id"]), tenant=str(record["tenant"]),
        custom_id=str(record["custom_id"]), model=str(record["model"]), prompt_tokens=int(record["prompt_tokens"]),
        max_tokens=int(record["max_tokens"]), deadline=seconds(record["deadline"]), priority=int(record["priority"]),
        quality_tier=QualityTier(record["quality_tier"]),
        quality_tolerance=float(record.get("quality_tolerance") or 0.0),
        pin=(str(pre), str(dec)) if pre and dec else None,
    )


def kv_ready(record: dict[str, Any]) -> KvReady:
    return KvReady(str(record["request_id"]), int(record["attempt"]), str(record["prefill_pool"]), KV_STORE)


def result(record: dict[str, Any]) -> ResultReceived:
    return ResultReceived(str(record["request_id"]), str(record["job_id"]), record["status"] == "OK",
                          int(record["prompt_tokens"]), int(record["completion_tokens"]))


def failure_kind(error_class: str, retryable: bool) -> FailureKind:
    if error_class == "KVIntegrityError":
        return FailureKind.KV_CHECKSUM
    return FailureKind.ERROR if retryable else FailureKind.INVALID


def attempt_failed(record: dict[str, Any]) -> AttemptFailed:
    return AttemptFailed(str(record["request_id"]), int(record["attempt"]), str(record["pool"]), Phase(record["phase"]),
                         failure_kind(str(record["error_class"]), bool(record["retryable"])),
                         f"{record['error_class']}: {record['error']}")


def output_written(record: dict[str, Any]) -> OutputWritten:
    return OutputWritten(str(record["job_id"]), int(record["lines"]), int(record.get("ok") or 0),
                         int(record.get("failed") or 0), int(record.get("tokens_in") or 0),
                         int(record.get("tokens_out") or 0))


def job_ended(record: dict[str, Any]) -> JobEnded | None:
    """A ``job_event`` from ``jobs.state`` as the dispatcher reads it: only final states end a job
    there (ADMITTED, RUNNING, PROGRESS and a verdict's REJECTED change nothing for it)."""
    state = JobState(record["state"])
    if not state.is_finished or state is JobState.REJECTED:
        return None
    return JobEnded(str(record["job_id"]), state, record.get("reason"), int(record["requests_done"]),
                    int(record["requests_failed"]), int(record["lines_written"]))


def cancel(record: dict[str, Any]) -> CancelRequested | None:
    if record["command"] != JobCommandKind.CANCEL:
        return None
    return CancelRequested(str(record["job_id"]), str(record["tenant"]), record.get("reason") or "cancelled by the tenant")


# -- decisions -> records ---------------------------------------------------------------------
def pending_request(q: RequestQueued, text: str, sampling: dict[str, Any], submitted_at_ms: int) -> dict[str, Any]:
    return {
        "request_id": q.request_id, "job_id": q.job_id, "tenant": q.tenant, "custom_id": q.custom_id,
        "priority": q.priority, "submitted_at": submitted_at_ms, "deadline": ms(q.deadline or 0.0), "model": q.model,
        "prompt": text, "prompt_tokens": q.prompt_tokens, "max_tokens": q.max_tokens, "sampling": sampling,
        "quality_tier": q.quality_tier.value, "quality_tolerance": q.quality_tolerance,
    }


def prefill_work(d: Dispatch, prompt: str, sampling: dict[str, Any], now: float,
                 canary: dict[str, Any] | None = None) -> dict[str, Any]:
    w = d.work
    return {
        "attempt_id": attempt_id(w.request_id, "prefill", d.attempt), "request_id": w.request_id, "job_id": w.job_id,
        "tenant": w.tenant, "custom_id": d.custom_id, "attempt": d.attempt, "pool": d.prefill_pool, "model": w.model,
        "prompt": prompt, "prompt_tokens": w.prompt_tokens, "max_tokens": w.max_output_tokens, "sampling": sampling,
        "priority": d.priority, "deadline": ms(w.deadline or 0.0), "colocated": d.colocated,
        "decode_pool": None if d.colocated else d.decode_pool, "quality_tier": w.quality_tier.value,
        "dispatched_at": ms(now), "canary": canary,
    }


def failed_result(d: FailRequest, now: float) -> dict[str, Any]:
    """The final FAILED result of a request (the result sink writes it as an error line)."""
    w = d.work
    return {
        "request_id": w.request_id, "job_id": w.job_id, "tenant": w.tenant, "custom_id": d.custom_id,
        "attempt_id": f"{w.request_id}/final/{d.attempt}", "attempt": d.attempt, "model": w.model,
        "status": "FAILED", "output_text": "", "output_token_ids": [], "finish_reason": "ERROR",
        "prompt_tokens": w.prompt_tokens, "completion_tokens": 0, "prefill_pool": None, "decode_pool": None,
        "colocated": False, "prefill_time_s": 0.0, "decode_time_s": 0.0, "kv_transfer_s": 0.0, "kv_bytes": 0,
        "error": d.reason, "error_code": d.code, "completed_at": ms(now),
    }


def job_event(j: JobChanged, now: float, output_file: str | None) -> dict[str, Any]:
    job = j.job
    finished_at, deadline = job["finished_at"], job["deadline"]
    missed = bool(finished_at is not None and deadline is not None and finished_at > deadline
                  and job["state"] not in ("REJECTED",))
    return {
        "event_id": job_event_id(job["job_id"], j.kind, j.seq), "job_id": job["job_id"], "tenant": job["tenant"],
        "kind": j.kind.value, "state": job["state"], "reason": j.reason,
        "earliest_feasible_deadline": ms(j.earliest_feasible_deadline) if j.earliest_feasible_deadline else None,
        "model": job["model"], "priority": job["priority"], "submitted_at": ms(job["submitted_at"]),
        "deadline": ms(deadline or 0.0), "requests_total": job["requests_total"], "requests_done": job["done"],
        "requests_failed": job["failed"], "tokens_in": job["tokens_in"], "tokens_out": job["tokens_out"],
        "deadline_missed": missed, "lines_written": job["lines_written"], "output_file": output_file, "at": ms(now),
    }


def job_changed_sends(j: JobChanged, now: float, output_file: Callable[[str, str], str | None]) -> list[Send]:
    """``job_event_sends`` naming the job's output (``output_file(tenant, job_id)``) once it has
    requests (a rejected job has none)."""
    job = j.job
    return job_event_sends(j, now, output_file(job["tenant"], job["job_id"]) if job["requests_total"] else None)


def job_event_sends(j: JobChanged, now: float, output_file: str | None) -> list[Send]:
    """The event on ``jobs.events`` and the same record as the job's snapshot on ``jobs.state``."""
    record = job_event(j, now, output_file)
    job_id = j.job["job_id"]
    return [Send(topics.JOBS_EVENTS, job_id, "job_event", record), Send(topics.JOBS_STATE, job_id, "job_event", record)]
