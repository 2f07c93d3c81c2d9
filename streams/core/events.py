"""What the control core is told: one typed event per thing that happens.

The live shell builds these from Kafka records (``streams/core/avro_edge.py``); the simulator
builds them from its simulated fleet. Times are epoch seconds. Events carry no prompt text:
the shell keeps texts beside the core and joins them back when it sends work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from phaseroute.schemas.enums import JobState, Phase, QualityTier
from phaseroute.streams.policy import FailureKind, FairConfig, PoolState, ProfileTable, TenantQuota

from .state import JobRecord


class PromptSize(NamedTuple):
    """One prompt of a submitted job, rendered and counted by intake."""

    custom_id: str
    tokens: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class JobSubmitted:
    """A job from ``jobs.submitted``, after intake read and counted its prompts. ``intake_error``
    set: the input could not be read (the job is rejected with that reason)."""

    job_id: str
    tenant: str
    model: str
    priority: int
    submitted_at: float
    deadline: float | None
    quality_tier: QualityTier
    quality_tolerance: float
    temperature: float
    prompts: tuple[PromptSize, ...]
    intake_error: str | None = None


@dataclass(frozen=True, slots=True)
class JobAdmitted:
    """A verdict an admission desk reached (``admission.judge``), read from ``jobs.admissions``:
    the tracker takes the job (``at``: when it was judged; the load snapshot says up to when it
    has taken verdicts, so a desk knows which of its own admissions the snapshot still lacks)."""

    job: JobRecord
    at: float


@dataclass(frozen=True, slots=True)
class RequestQueued:
    """An admitted request read back from ``requests.pending`` (the hop between admission and
    dispatch)."""

    request_id: str
    job_id: str
    tenant: str
    custom_id: str
    model: str
    prompt_tokens: int
    max_tokens: int
    deadline: float | None
    priority: int
    quality_tier: QualityTier
    quality_tolerance: float
    pin: tuple[str, str] | None = None  # (prefill pool, decode pool): placed there, not routed (a canary)


@dataclass(frozen=True, slots=True)
class KvReady:
    """A prefill finished and its KV is stored at ``kv_at`` (the KV store, or a pool)."""

    request_id: str
    attempt_number: int
    pool: str
    kv_at: str


@dataclass(frozen=True, slots=True)
class ResultReceived:
    """A result read from ``results`` (ok, or a failure with its reason); the first per request wins."""

    request_id: str
    job_id: str
    ok: bool
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class AttemptFailed:
    request_id: str
    attempt_number: int
    pool: str
    phase: Phase
    kind: FailureKind
    detail: str


@dataclass(frozen=True, slots=True)
class OutputWritten:
    """The result sink's receipt: ``lines`` distinct lines of the job's output are durable, ``ok``
    of them results and ``failed`` errors, with ``tokens_in``/``tokens_out`` in their usage (the
    exact tallies of the output, which the job's counters are taken from)."""

    job_id: str
    lines: int
    ok: int
    failed: int
    tokens_in: int
    tokens_out: int


@dataclass(frozen=True, slots=True)
class CancelRequested:
    job_id: str
    tenant: str
    reason: str


@dataclass(frozen=True, slots=True)
class JobEnded:
    """A job's final state as its tracker published it (``jobs.state``): the dispatcher fails the
    open requests of a CANCELLED or EXPIRED job, and forgets the requests of a job whose output
    is whole (``lines_written`` covers every request). Non-final states are not sent."""

    job_id: str
    state: JobState
    reason: str | None
    done: int
    failed: int
    lines_written: int


@dataclass(frozen=True, slots=True)
class FleetObserved:
    """The pools as heartbeats report them now. ``in_flight`` and ``recent_failures`` of these
    states are ignored: the core counts its own."""

    pools: tuple[PoolState, ...]


@dataclass(frozen=True, slots=True)
class ProfilesUpdated:
    table: ProfileTable


@dataclass(frozen=True, slots=True)
class TenantsUpdated:
    """Tenant weights, in-flight caps and quotas from the tenant registry."""

    fair: FairConfig
    quotas: dict[str, TenantQuota]


Event = (JobSubmitted | JobAdmitted | RequestQueued | KvReady | ResultReceived | AttemptFailed | OutputWritten | CancelRequested
         | JobEnded | FleetObserved | ProfilesUpdated | TenantsUpdated)
