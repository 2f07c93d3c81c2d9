"""Typed records of the operations side: telemetry, heartbeats, profiles, dead letters.

Same conventions as `records`: fields in .avsc order with the .avsc defaults; docs and units
in ``avro/<kind>.avsc``; timestamps are int epoch milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from phaseroute.schemas.enums import (
    BatchStatus,
    DeadLetterStage,
    Phase,
    PoolPhase,
    ProfileSource,
    QualityAlertKind,
    QualityState,
    TelemetryPhase,
    WorkerStatus,
)
from phaseroute.schemas.typed import AvroRecord

record = dataclass(frozen=True, slots=True, kw_only=True)


@record
class PhaseTelemetry(AvroRecord):
    KIND: ClassVar[str] = "phase_telemetry"
    batch_id: str
    pool: str
    worker_id: str
    model: str
    phase: TelemetryPhase
    variant: str
    batch_size: int
    tokens_in: int
    tokens_out: int
    seq_len_mean: float
    seq_len_max: int
    queue_wait_s: float
    exec_time_s: float
    steps: int = 1
    step_latency_s: float
    step_latency_s_max: float = 0.0
    kv_bytes: int = 0
    kv_transfer_s: float = 0.0
    source_pool: str | None = None
    status: BatchStatus = BatchStatus.OK
    error_class: str | None = None
    at: int


@record
class AttemptFailed(AvroRecord):
    KIND: ClassVar[str] = "attempt_failed"
    attempt_id: str
    request_id: str
    job_id: str
    tenant: str
    attempt: int
    phase: Phase
    pool: str
    worker_id: str
    error_class: str
    error: str
    retryable: bool
    at: int


@record
class PoolHeartbeat(AvroRecord):
    KIND: ClassVar[str] = "pool_heartbeat"
    pool: str
    worker_id: str
    phase: PoolPhase
    variant: str
    device: str = "cpu"
    models: list[str]
    queue_depth: int
    consumer_lag: int
    batch_in_flight: int
    max_batch: int
    memory_bytes: int
    kv_free_bytes: int
    kv_capacity_bytes: int | None = None
    kv_format: str | None = None
    host: str
    pid: int
    status: WorkerStatus
    started_at: int
    interval_s: float = 5.0
    at: int


@record
class BatchPoint(AvroRecord):
    batch_size: int
    tokens_per_s: float


@record
class PathQuality(AvroRecord):
    exact_ok: bool
    state: QualityState
    greedy_agreement: float
    top1_agreement: float
    mean_kl: float
    max_kl: float
    canary_set: str
    reason: str | None = None


@record
class ProfileRow(AvroRecord):
    KIND: ClassVar[str] = "profile_row"
    model: str
    phase: TelemetryPhase
    pool: str
    variant: str
    source_pool: str | None = None
    source: ProfileSource
    batch_curve: list[BatchPoint] = field(default_factory=list)
    step_latency_s_p50: float
    step_latency_s_p90: float
    step_latency_s_p99: float
    tokens_per_s: float
    mem_bytes_per_token: float
    kv_bytes_per_token: float
    transfer_bytes_per_s: float | None = None
    transfer_latency_s: float | None = None
    error_rate: float = 0.0
    quality_score: float | None = None
    samples: int
    window_s: float
    updated_at: int
    path_quality: PathQuality | None = None


@record
class DriftMeasurement(AvroRecord):
    KIND: ClassVar[str] = "drift_measurement"
    measurement_id: str
    model: str
    prefill_pool: str
    decode_pool: str
    colocated: bool
    prefill_variant: str
    decode_variant: str
    canary_set: str
    round: int
    canaries_sent: int
    canaries_received: int
    positions: int
    greedy_agreement: float
    top1_agreement: float
    mean_kl: float
    max_kl: float
    first_divergence_mean: float
    first_divergence_min: int
    quality_score: float
    exact_ok: bool
    state: QualityState
    reason: str | None = None
    at: int


@record
class QualityAlert(AvroRecord):
    KIND: ClassVar[str] = "quality_alert"
    alert_id: str
    model: str
    prefill_pool: str
    decode_pool: str
    colocated: bool
    kind: QualityAlertKind
    reason: str
    greedy_agreement: float
    top1_agreement: float
    mean_kl: float
    max_kl: float
    measurement_id: str
    at: int


@record
class DeadLetter(AvroRecord):
    KIND: ClassVar[str] = "dead_letter"
    source_topic: str
    partition: int
    offset: int
    key: bytes | None = None
    value: bytes | None = None
    reason: str
    error_class: str
    stage: DeadLetterStage
    expected_kind: str | None = None
    traceback: str | None = None
    service: str
    at: int


@record
class ApiKey(AvroRecord):
    key_id: str
    key_hash: str
    created_at: int
    revoked_at: int | None = None


@record
class Tenant(AvroRecord):
    KIND: ClassVar[str] = "tenant"
    name: str
    weight: float = 1.0
    max_in_flight: int | None = None
    max_queued_tokens: int | None = None
    max_running_jobs: int | None = None
    keys: list[ApiKey] = field(default_factory=list)
    disabled: bool = False
    updated_at: int
