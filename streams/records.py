"""The messages the control plane sends, built from its table entries (plain dicts)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phaseroute.schemas.ids import job_event_id


@dataclass(frozen=True)
class Send:
    """One message for the Faust layer to send: topic, key, Avro kind, record."""

    topic: str
    key: str
    kind: str
    record: dict[str, Any]


def ms(seconds: float) -> int:
    return int(seconds * 1000)


def job_event(job: dict[str, Any], kind: str, now: float, reason: str | None = None,
              earliest_feasible_deadline: float | None = None, seq: int = 0) -> dict[str, Any]:
    """A ``job_event`` record for the job's current state."""
    finished = job["state"] in ("COMPLETED", "FAILED", "CANCELLED", "EXPIRED")
    return {
        "event_id": job_event_id(job["job_id"], kind, seq), "job_id": job["job_id"], "tenant": job["tenant"],
        "kind": kind, "state": job["state"], "reason": reason,
        "earliest_feasible_deadline": ms(earliest_feasible_deadline) if earliest_feasible_deadline else None,
        "model": job["model"], "priority": job["priority"], "submitted_at": job["submitted_at_ms"],
        "deadline": job["deadline_ms"], "requests_total": job["requests_total"], "requests_done": job["done"],
        "requests_failed": job["failed"], "tokens_in": job["tokens_in"], "tokens_out": job["tokens_out"],
        "deadline_missed": bool(finished and job.get("finished_at") and job["finished_at"] * 1000 > job["deadline_ms"]),
        "output_file": job.get("output_file"), "at": ms(now),
    }


def job_event_sends(job: dict[str, Any], kind: str, now: float, **kw: Any) -> list[Send]:
    """The event on ``jobs.events`` and the same record as the job's snapshot on ``jobs.state``."""
    event = job_event(job, kind, now, **kw)
    return [Send("jobs.events", job["job_id"], "job_event", event), Send("jobs.state", job["job_id"], "job_event", event)]


def prefill_work(rid: str, req: dict[str, Any], attempt_id: str, attempt: int, pool: str,
                 decode_pool: str | None, colocated: bool, now: float) -> dict[str, Any]:
    return {
        "attempt_id": attempt_id, "request_id": rid, "job_id": req["job_id"], "tenant": req["tenant"],
        "custom_id": req["custom_id"], "attempt": attempt, "pool": pool, "model": req["model"], "prompt": req["prompt"],
        "prompt_tokens": req["prompt_tokens"], "max_tokens": req["max_tokens"], "sampling": req["sampling"],
        "priority": req["priority"], "deadline": req["deadline_ms"], "colocated": colocated,
        "decode_pool": None if colocated else decode_pool, "quality_tier": req["quality_tier"], "dispatched_at": ms(now),
    }


def decode_work(rid: str, req: dict[str, Any], attempt_id: str, attempt: int, pool: str, now: float) -> dict[str, Any]:
    kv = req["kv"]
    return {
        "attempt_id": attempt_id, "request_id": rid, "job_id": req["job_id"], "tenant": req["tenant"],
        "custom_id": req["custom_id"], "attempt": attempt, "pool": pool, "model": req["model"],
        "source_pool": kv["prefill_pool"], "prefill_attempt_id": kv["attempt_id"], "kv_location": kv["kv_location"],
        "kv_bytes": kv["kv_bytes"], "kv_checksum": kv["kv_checksum"], "kv_layout_version": kv["kv_layout_version"],
        "prompt_tokens": kv["prompt_tokens"], "first_token": kv["first_token"], "max_tokens": req["max_tokens"],
        "sampling": req["sampling"], "priority": req["priority"], "deadline": req["deadline_ms"],
        "quality_tier": req["quality_tier"], "prefill_time_s": kv["prefill_time_s"], "dispatched_at": ms(now),
    }


def failed_result(rid: str, req: dict[str, Any], reason: str, now: float) -> dict[str, Any]:
    """The final FAILED result of a request that gave up (the sink writes it as an error line)."""
    return {
        "request_id": rid, "job_id": req["job_id"], "tenant": req["tenant"], "custom_id": req["custom_id"],
        "attempt_id": f"{rid}/final/{req['attempt']}", "attempt": req["attempt"], "model": req["model"],
        "status": "FAILED", "output_text": "", "output_token_ids": [], "finish_reason": "ERROR",
        "prompt_tokens": req["prompt_tokens"], "completion_tokens": 0, "prefill_pool": req.get("prefill_pool"),
        "decode_pool": req.get("decode_pool"), "colocated": bool(req.get("colocated")), "prefill_time_s": 0.0,
        "decode_time_s": 0.0, "kv_transfer_s": 0.0, "kv_bytes": 0, "error": reason, "completed_at": ms(now),
    }
