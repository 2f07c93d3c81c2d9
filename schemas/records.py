"""Typed records of the request path: job in, requests, prefill/decode work, KV ready, result,
output receipt.

One frozen dataclass per Avro record, fields in .avsc order with the .avsc defaults; the
field docs (with units) live in ``avro/<kind>.avsc``. Timestamps are int epoch milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from phaseroute.schemas.enums import (
    CanaryMode,
    FinishReason,
    JobCommandKind,
    JobEventKind,
    JobState,
    QualityTier,
    ResultStatus,
)
from phaseroute.schemas.typed import AvroRecord

record = dataclass(frozen=True, slots=True, kw_only=True)


@record
class Sampling(AvroRecord):
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 256
    seed: int | None = None
    stop: list[str] = field(default_factory=list)


@record
class ChatMessage(AvroRecord):
    role: str
    content: str


@record
class RequestItem(AvroRecord):
    custom_id: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    max_tokens: int | None = None


@record
class CanaryProbe(AvroRecord):
    canary_id: str
    mode: CanaryMode
    forced_token_ids: list[int] = field(default_factory=list)
    probe_token_ids: list[int] = field(default_factory=list)
    probe_width: int = 0


@record
class CanaryTrace(AvroRecord):
    argmax_ids: list[int] = field(default_factory=list)
    probe_logprobs: list[float] = field(default_factory=list)


@record
class JobSubmitted(AvroRecord):
    KIND: ClassVar[str] = "job_submitted"
    job_id: str
    tenant: str
    priority: int = 0
    submitted_at: int
    deadline: int
    model: str
    quality_tier: QualityTier = QualityTier.EXACT
    quality_tolerance: float | None = None
    sampling: Sampling
    requests: list[RequestItem] = field(default_factory=list)
    input_file: str | None = None
    output_file: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)


@record
class JobCommand(AvroRecord):
    KIND: ClassVar[str] = "job_command"
    job_id: str
    tenant: str
    command: JobCommandKind
    at: int
    reason: str | None = None


@record
class JobEvent(AvroRecord):
    KIND: ClassVar[str] = "job_event"
    event_id: str
    job_id: str
    tenant: str
    kind: JobEventKind
    state: JobState
    reason: str | None = None
    earliest_feasible_deadline: int | None = None
    model: str
    priority: int
    submitted_at: int
    deadline: int
    requests_total: int = 0
    requests_done: int = 0
    requests_failed: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    deadline_missed: bool = False
    lines_written: int = 0
    output_file: str | None = None
    at: int


@record
class Request(AvroRecord):
    KIND: ClassVar[str] = "request"
    request_id: str
    job_id: str
    tenant: str
    custom_id: str
    priority: int
    submitted_at: int
    deadline: int
    model: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    sampling: Sampling
    quality_tier: QualityTier = QualityTier.EXACT
    quality_tolerance: float | None = None
    pinned_prefill_pool: str | None = None
    pinned_decode_pool: str | None = None
    canary: CanaryProbe | None = None


@record
class PrefillWork(AvroRecord):
    KIND: ClassVar[str] = "prefill_work"
    attempt_id: str
    request_id: str
    job_id: str
    tenant: str
    custom_id: str
    attempt: int = 0
    pool: str
    model: str
    prompt: str
    prompt_tokens: int
    max_tokens: int
    sampling: Sampling
    priority: int = 0
    deadline: int
    colocated: bool = False
    decode_pool: str | None = None
    quality_tier: QualityTier = QualityTier.EXACT
    dispatched_at: int
    canary: CanaryProbe | None = None


@record
class KvReady(AvroRecord):
    KIND: ClassVar[str] = "kv_ready"
    attempt_id: str
    request_id: str
    job_id: str
    tenant: str
    custom_id: str
    attempt: int = 0
    prefill_pool: str
    worker_id: str
    model: str
    variant: str
    kv_location: str
    kv_bytes: int
    kv_checksum: str
    kv_layout_version: int = 1
    prompt_tokens: int
    first_token: int
    max_tokens: int
    sampling: Sampling
    priority: int = 0
    deadline: int
    quality_tier: QualityTier = QualityTier.EXACT
    decode_pool: str | None = None
    prefill_time_s: float
    queue_wait_s: float
    created_at: int


@record
class DecodeWork(AvroRecord):
    KIND: ClassVar[str] = "decode_work"
    attempt_id: str
    request_id: str
    job_id: str
    tenant: str
    custom_id: str
    attempt: int = 0
    pool: str
    model: str
    source_pool: str
    prefill_attempt_id: str
    kv_location: str
    kv_bytes: int
    kv_checksum: str
    kv_layout_version: int = 1
    prompt_tokens: int
    first_token: int
    max_tokens: int
    sampling: Sampling
    priority: int = 0
    deadline: int
    quality_tier: QualityTier = QualityTier.EXACT
    prefill_time_s: float = 0.0
    dispatched_at: int
    canary: CanaryProbe | None = None
    canary_trace: CanaryTrace | None = None


@record
class Result(AvroRecord):
    KIND: ClassVar[str] = "result"
    request_id: str
    job_id: str
    tenant: str
    custom_id: str
    attempt_id: str
    attempt: int = 0
    model: str
    status: ResultStatus
    output_text: str = ""
    output_token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    prefill_pool: str | None = None
    decode_pool: str | None = None
    colocated: bool = False
    prefill_time_s: float = 0.0
    decode_time_s: float = 0.0
    kv_transfer_s: float = 0.0
    kv_bytes: int = 0
    error: str | None = None
    error_code: str | None = None
    completed_at: int
    canary: CanaryProbe | None = None
    canary_trace: CanaryTrace | None = None


@record
class OutputWritten(AvroRecord):
    KIND: ClassVar[str] = "output_written"
    job_id: str
    lines: int
    ok: int = 0
    failed: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    path: str
    writer: str
    at: int
