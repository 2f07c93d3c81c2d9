"""The Avro edge of the control plane's own hops: an admission desk's verdict (``job_admission``
on ``jobs.admissions``) <-> the tracker's ``JobAdmitted``, and the dispatcher's load
(``load_snapshot`` on ``control.load``) <-> the backlog and fleet rate per model a desk judges against. Times are epoch
milliseconds on the wire, epoch seconds in the core; enums travel by their Avro symbols.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from phaseroute.infra import topics
from phaseroute.schemas.enums import JobState, QualityTier
from phaseroute.streams.core import JobAdmitted, JobRecord
from phaseroute.streams.edge import Send, ms, seconds
from phaseroute.streams.policy import BacklogJob, FleetRate

LOAD_KEY = "load"


def admission_send(job: JobRecord, desk: str, now: float) -> Send:
    """The verdict on ``job`` for ``jobs.admissions`` (keyed by job id, like ``jobs.submitted``)."""
    record = {
        "job_id": job.job_id, "tenant": job.tenant, "model": job.model, "priority": job.priority,
        "submitted_at": ms(job.submitted_at), "deadline": None if job.deadline is None else ms(job.deadline),
        "quality_tier": job.quality_tier.value, "state": job.state.value, "reason": job.reason,
        "requests_total": job.requests_total, "prefill_left": job.prefill_left, "decode_left": job.decode_left,
        "estimated_completion": None if job.estimated_completion is None else ms(job.estimated_completion),
        "submissions": job.submissions, "desk": desk, "at": ms(now),
    }
    return Send(topics.JOBS_ADMISSIONS, job.job_id, "job_admission", record)


def admitted_job(record: dict[str, Any]) -> JobRecord:
    """The judged job of a ``job_admission`` record, as the tracker keeps it."""
    at = float(record["at"]) / 1000.0
    state = JobState(record["state"])
    return JobRecord(
        str(record["job_id"]), str(record["tenant"]), str(record["model"]), int(record["priority"]),
        float(record["submitted_at"]) / 1000.0, seconds(record["deadline"]), QualityTier(record["quality_tier"]),
        state, requests_total=int(record["requests_total"]), estimated_completion=seconds(record["estimated_completion"]),
        finished_at=at if state is JobState.REJECTED else None, reason=record["reason"],
        submissions=int(record["submissions"]), prefill_left=int(record["prefill_left"]),
        decode_left=int(record["decode_left"]),
    )


def job_admitted(record: dict[str, Any]) -> JobAdmitted:
    return JobAdmitted(admitted_job(record), float(record["at"]) / 1000.0)


@dataclass(frozen=True, slots=True)
class Load:
    """The dispatcher's load as a desk reads it: ``at`` (its age is checked), the backlog, up to
    when the tracker had taken verdicts, and the fleet's rate per model as the dispatcher sees it."""

    at: float
    dispatcher: str
    admissions_through: float
    queued_requests: int
    backlog: tuple[BacklogJob, ...]
    fleet: Mapping[str, FleetRate] | None = None  # None: a dispatcher from before the snapshot carried it


def load_send(backlog: list[BacklogJob], admissions_through: float, queued: int, dispatcher: str, now: float,
              fleet: Mapping[str, FleetRate]) -> Send:
    record = {
        "at": ms(now), "dispatcher": dispatcher, "admissions_through": ms(admissions_through), "queued_requests": queued,
        "backlog": [{"job_id": b.job_id, "tenant": b.tenant, "model": b.model,
                     "deadline": None if b.deadline is None else ms(b.deadline), "prefill_left": b.prefill_tokens,
                     "decode_left": b.decode_tokens} for b in backlog],
        "fleet": [{"model": model, "prefill_tokens_per_s": rate.prefill_tokens_per_s,
                   "decode_tokens_per_s": rate.decode_tokens_per_s} for model, rate in sorted(fleet.items())],
    }
    return Send(topics.CONTROL_LOAD, LOAD_KEY, "load_snapshot", record)


def load_of(record: dict[str, Any]) -> Load:
    backlog = tuple(BacklogJob(str(b["job_id"]), str(b["tenant"]), str(b["model"]), seconds(b["deadline"]),
                               int(b["prefill_left"]), int(b["decode_left"])) for b in record["backlog"])
    fleet = record.get("fleet")
    rates = None if fleet is None else {
        str(f["model"]): FleetRate(float(f["prefill_tokens_per_s"]), float(f["decode_tokens_per_s"])) for f in fleet}
    return Load(float(record["at"]) / 1000.0, str(record["dispatcher"]), float(record["admissions_through"]) / 1000.0,
                int(record["queued_requests"]), backlog, rates)
