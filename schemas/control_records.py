"""Typed records of the control plane's own hops: an admission desk's verdict for the tracker
(``job_admission``) and the dispatcher's load for the desks (``load_snapshot``).

One frozen dataclass per Avro record, fields in .avsc order with the .avsc defaults; the field
docs (with units) live in ``avro/<kind>.avsc``. Timestamps are int epoch milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from phaseroute.schemas.enums import JobState, QualityTier
from phaseroute.schemas.typed import AvroRecord

record = dataclass(frozen=True, slots=True, kw_only=True)


@record
class JobAdmission(AvroRecord):
    KIND: ClassVar[str] = "job_admission"
    job_id: str
    tenant: str
    model: str
    priority: int
    submitted_at: int
    deadline: int | None = None
    quality_tier: QualityTier
    state: JobState
    reason: str | None = None
    requests_total: int
    prefill_left: int
    decode_left: int
    estimated_completion: int | None = None
    submissions: int
    desk: str
    at: int


@record
class BacklogEntry(AvroRecord):
    job_id: str
    tenant: str
    model: str
    deadline: int | None = None
    prefill_left: int
    decode_left: int


@record
class FleetRateEntry(AvroRecord):
    model: str
    prefill_tokens_per_s: float
    decode_tokens_per_s: float


@record
class LoadSnapshot(AvroRecord):
    KIND: ClassVar[str] = "load_snapshot"
    at: int
    dispatcher: str
    admissions_through: int
    queued_requests: int
    backlog: list[BacklogEntry]
    fleet: list[FleetRateEntry] | None = None
