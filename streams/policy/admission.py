"""Admission: admit a submitted job, or reject it with a reason the user can act on.

Order of checks (the first failure decides): malformed input -> empty job -> unknown model
-> prompt + max output over the model's context -> deadline already past -> tenant quotas
(queued tokens, running jobs) -> fleet capacity for the model -> a request bigger than any
one worker's KV memory (only where every serving pool reports its workers' capacity) ->
deadline feasibility. The completion estimate converts every job's remaining tokens into
seconds at the fleet's measured throughput for its model (prefill tokens / prefill tokens/s +
output tokens / decode tokens/s, times ``safety_factor``) and slots the new job into the
admitted backlog in deadline order (``feasibility``). An infeasible deadline is rejected early, naming the
earliest deadline that would be accepted now. An admitted job comes back split into requests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from phaseroute.schemas import ids

from . import _checks
from .confidence import ConfidenceConfig, effective_profile
from .cost_model import FleetRate, fleet_rate
from .feasibility import QueuedWork, check_deadline
from .types import Phase, PoolState, ProfileTable, QualityTier, RequestWork


@dataclass(frozen=True)
class ModelSpec:
    name: str
    context_tokens: int


@dataclass(frozen=True)
class JobSpec:
    """A submitted job as decoded from ``jobs.submitted`` (validated by :func:`admit`, not here)."""

    job_id: str
    tenant: str
    model: str
    prompt_tokens: tuple[int, ...]
    max_output_tokens: int
    deadline: float | None = None
    quality_tier: QualityTier = QualityTier.EXACT
    quality_tolerance: float = 0.0
    priority: int = 0
    custom_ids: tuple[str, ...] = ()  # the client's id per prompt; empty: "0", "1", ...
    output_tokens: tuple[int, ...] = ()
    """Output cap per prompt (each request's own max_tokens); empty: ``max_output_tokens`` for
    every prompt. Admission, quotas and the router then count what each request may generate."""

    def custom_id(self, index: int) -> str:
        return self.custom_ids[index] if self.custom_ids else str(index)

    def output_cap(self, index: int) -> int:
        return self.output_tokens[index] if self.output_tokens else self.max_output_tokens

    def total_output_tokens(self) -> int:
        """The most output tokens the whole job may generate."""
        return sum(self.output_tokens) if self.output_tokens else self.max_output_tokens * len(self.prompt_tokens)


@dataclass(frozen=True)
class BacklogJob:
    """An admitted, unfinished job: its remaining tokens per phase."""

    job_id: str
    tenant: str
    model: str
    deadline: float | None
    prefill_tokens: int
    decode_tokens: int


@dataclass(frozen=True)
class TenantQuota:
    max_queued_tokens: int | None = None  # prompt + output tokens admitted and unfinished; None = no limit
    max_running_jobs: int | None = None  # admitted, unfinished jobs; None = no limit


@dataclass(frozen=True)
class AdmissionConfig:
    confidence: ConfidenceConfig = field(default_factory=ConfidenceConfig)
    default_quota: TenantQuota = field(default_factory=lambda: TenantQuota(200_000_000, 1_000))
    """Quota of a tenant missing from the ``quotas`` mapping."""
    safety_factor: float = 1.2
    """Work estimates are multiplied by this (prefill and decode assumed not to overlap, plus margin)."""
    expected_output_fraction: float = 1.0
    """Output tokens expected per request, as a fraction of its output cap."""

    def __post_init__(self) -> None:
        _checks.at_least("AdmissionConfig", "safety_factor", self.safety_factor, 1.0)
        _checks.fraction("AdmissionConfig", "expected_output_fraction", self.expected_output_fraction)


class RejectCode(StrEnum):
    MALFORMED = "malformed"
    EMPTY_JOB = "empty_job"
    UNKNOWN_MODEL = "unknown_model"
    PROMPT_TOO_LONG = "prompt_too_long"
    DEADLINE_PASSED = "deadline_passed"
    QUOTA_QUEUED_TOKENS = "quota_queued_tokens"
    QUOTA_RUNNING_JOBS = "quota_running_jobs"
    NO_CAPACITY = "no_capacity"
    REQUEST_TOO_LARGE = "request_too_large"
    DEADLINE_INFEASIBLE = "deadline_infeasible"


@dataclass(frozen=True)
class Rejected:
    job_id: str
    code: RejectCode
    reason: str
    earliest_feasible_deadline: float | None = None


@dataclass(frozen=True)
class Admitted:
    job_id: str
    estimated_completion: float
    work_s: float
    requests: tuple[RequestWork, ...]


def format_time(epoch_s: float) -> str:
    """A time for a user: ISO 8601 in UTC to the second (``2026-12-01T20:17:28+00:00``)."""
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="seconds")


def request_id(job_id: str, custom_id: str) -> str:
    """The request's id as the messages carry it (one definition: :mod:`phaseroute.schemas.ids`)."""
    return ids.request_id(job_id, custom_id)


def split_job(job: JobSpec) -> tuple[RequestWork, ...]:
    """One request per prompt, with deterministic ids from (job_id, custom_id)."""
    return tuple(
        RequestWork(
            request_id(job.job_id, job.custom_id(i)),
            job.job_id,
            job.tenant,
            job.model,
            tokens,
            job.output_cap(i),
            job.deadline,
            job.quality_tier,
            job.quality_tolerance,
        )
        for i, tokens in enumerate(job.prompt_tokens)
    )


def _malformed(job: JobSpec) -> str | None:
    for name in ("job_id", "tenant", "model"):
        value = getattr(job, name)
        if not isinstance(value, str) or not value.strip():
            return f"{name} must be a non-empty string, got {value!r}"
    if not isinstance(job.max_output_tokens, int) or job.max_output_tokens < 1:
        return f"max_output_tokens must be an integer >= 1, got {job.max_output_tokens!r}"
    if job.output_tokens:
        if not isinstance(job.output_tokens, (tuple, list)) or len(job.output_tokens) != len(job.prompt_tokens):
            return (f"output_tokens must give one cap per prompt ({len(job.prompt_tokens)}),"
                    f" got {len(job.output_tokens) if isinstance(job.output_tokens, (tuple, list)) else job.output_tokens!r}")
        bad = next((i for i, n in enumerate(job.output_tokens) if not isinstance(n, int) or n < 1), None)
        if bad is not None:
            return f"output_tokens[{bad}] must be an integer >= 1, got {job.output_tokens[bad]!r}"
    if not isinstance(job.prompt_tokens, (tuple, list)):
        return f"prompt_tokens must be a list of token counts, got {type(job.prompt_tokens).__name__}"
    for i, tokens in enumerate(job.prompt_tokens):
        if not isinstance(tokens, int) or tokens < 1:
            return f"prompt {i} must have an integer token count >= 1, got {tokens!r}"
    if not _is_number(job.quality_tolerance) or not 0.0 <= job.quality_tolerance <= 1.0:
        return f"quality_tolerance must be in [0, 1], got {job.quality_tolerance!r}"
    if job.deadline is not None and not (_is_number(job.deadline) and math.isfinite(job.deadline)):
        return f"deadline must be a finite time, got {job.deadline!r}"
    problem = ids.job_id_problem(job.job_id)
    if problem is not None:
        return problem
    for i in range(len(job.custom_ids)):
        problem = ids.custom_id_problem(job.custom_ids[i])
        if problem is not None:
            return f"request {i}: {problem}"
    seen: set[str] = set()
    for custom_id in job.custom_ids:
        if custom_id in seen:
            return f"custom_id {custom_id!r} appears twice; each request of a job needs its own"
        seen.add(custom_id)
    if not isinstance(job.quality_tier, QualityTier):
        return f"quality_tier must be one of {[t.value for t in QualityTier]}, got {job.quality_tier!r}"
    return None


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _validate(job: JobSpec, models: Mapping[str, ModelSpec], now: float) -> Rejected | None:
    reason = _malformed(job)
    if reason is not None:
        return Rejected(job.job_id, RejectCode.MALFORMED, reason)
    if not job.prompt_tokens:
        return Rejected(job.job_id, RejectCode.EMPTY_JOB, "job has no prompts; submit at least one")
    spec = models.get(job.model)
    if spec is None:
        return Rejected(job.job_id, RejectCode.UNKNOWN_MODEL, f"unknown model {job.model!r}; known: {sorted(models)}")
    longest = max(range(len(job.prompt_tokens)), key=lambda i: job.prompt_tokens[i] + job.output_cap(i))
    cap = job.output_cap(longest)
    prompt = job.prompt_tokens[longest]
    if prompt + cap > spec.context_tokens:
        allowed = spec.context_tokens - cap
        fix = (f"prompts may have at most {allowed} tokens at this max_tokens" if allowed >= 1 else
               f"max_tokens must be at most {spec.context_tokens - prompt} for this prompt")
        return Rejected(
            job.job_id,
            RejectCode.PROMPT_TOO_LONG,
            f"request {job.custom_id(longest)!r} has {prompt} prompt tokens + max_tokens {cap}"
            f" > the context limit of {spec.context_tokens} tokens of {job.model!r}; {fix}",
        )
    if job.deadline is not None and job.deadline <= now:
        return Rejected(
            job.job_id, RejectCode.DEADLINE_PASSED,
            f"deadline {format_time(job.deadline)} is not after now ({format_time(now)})",
        )
    return None


def _check_quota(job: JobSpec, backlog: Sequence[BacklogJob], quota: TenantQuota, job_tokens: int) -> Rejected | None:
    mine = [b for b in backlog if b.tenant == job.tenant]
    if quota.max_running_jobs is not None and len(mine) >= quota.max_running_jobs:
        return Rejected(
            job.job_id,
            RejectCode.QUOTA_RUNNING_JOBS,
            f"tenant {job.tenant!r} has {len(mine)} unfinished jobs, quota {quota.max_running_jobs};"
            " wait for one to finish",
        )
    queued = sum(b.prefill_tokens + b.decode_tokens for b in mine)
    if quota.max_queued_tokens is not None and queued + job_tokens > quota.max_queued_tokens:
        return Rejected(
            job.job_id,
            RejectCode.QUOTA_QUEUED_TOKENS,
            f"tenant {job.tenant!r} has {queued} tokens queued + {job_tokens} in this job > quota"
            f" {quota.max_queued_tokens}; split the job or wait",
        )
    return None


class _Rates:
    """Fleet prefill/decode tokens per second per model, once per admit call: the rate the
    dispatcher published (``published``) where it gives both phases some, else computed from
    ``pools`` and ``profiles`` (a pool that just came up may be in the desk's view a moment
    before the dispatcher's snapshot counts it)."""

    def __init__(self, pools: list[PoolState], profiles: ProfileTable, now: float, config: AdmissionConfig,
                 published: Mapping[str, FleetRate] | None = None) -> None:
        self._args = (pools, profiles, now, config.confidence)
        self._published = published
        self._cache: dict[str, tuple[float, float]] = {}

    def __call__(self, model: str) -> tuple[float, float]:
        if model not in self._cache:
            rate = (self._published or {}).get(model)
            if rate is None or rate.prefill_tokens_per_s <= 0 or rate.decode_tokens_per_s <= 0:
                rate = fleet_rate(model, *self._args)
            self._cache[model] = (rate.prefill_tokens_per_s, rate.decode_tokens_per_s)
        return self._cache[model]


def _work_s(rates: tuple[float, float], prefill: float, decode: float, config: AdmissionConfig) -> float:
    if rates[0] <= 0 or rates[1] <= 0:
        return math.inf
    return config.safety_factor * (prefill / rates[0] + decode / rates[1])


def _backlog_work(
    backlog: Sequence[BacklogJob], rates: _Rates, config: AdmissionConfig
) -> tuple[list[QueuedWork], float]:
    """Seconds of work of each admitted job with a deadline, and the total of those without one.
    Jobs of a model no pool can serve now are left out: they do not compete for the fleet."""
    queued: list[QueuedWork] = []
    best_effort_s = 0.0
    for b in backlog:
        w = _work_s(rates(b.model), b.prefill_tokens, b.decode_tokens, config)
        if math.isinf(w):
            continue
        if b.deadline is None:
            best_effort_s += w
        else:
            queued.append(QueuedWork(b.job_id, b.deadline, w))
    return queued, best_effort_s


def _tokens_one_worker_holds(
    job: JobSpec, phase: Phase, pools: Sequence[PoolState], profiles: ProfileTable, now: float, config: AdmissionConfig
) -> tuple[float, str] | None:
    """The most KV tokens of ``job.model`` one worker can hold for ``phase``, over the alive
    pools that serve it, and that pool; None when some serving pool does not report its
    workers' capacity (or has no profile): then nothing is known to be too large."""
    best: tuple[float, str] | None = None
    for pool in pools:
        if not (pool.alive and pool.serves(phase) and job.model in pool.models):
            continue
        eff = effective_profile(profiles, job.model, phase, pool.name, pool.variant, now, config.confidence)
        capacity = pool.worker_kv_capacity_bytes
        if eff is None or capacity is None or eff.row.kv_bytes_per_token <= 0:
            return None
        tokens = capacity / eff.row.kv_bytes_per_token
        if best is None or tokens > best[0]:
            best = (tokens, pool.name)
    return best


def _too_large(
    job: JobSpec, pools: Sequence[PoolState], profiles: ProfileTable, now: float, config: AdmissionConfig
) -> Rejected | None:
    """A request whose KV no single worker can hold would wait forever: prefill holds its
    prompt, decode its prompt and every output token, on one worker."""
    needs = {
        Phase.PREFILL: max(range(len(job.prompt_tokens)), key=lambda i: job.prompt_tokens[i]),
        Phase.DECODE: max(range(len(job.prompt_tokens)), key=lambda i: job.prompt_tokens[i] + job.output_cap(i)),
    }
    for phase, i in needs.items():
        need = job.prompt_tokens[i] + (job.output_cap(i) if phase is Phase.DECODE else 0)
        limit = _tokens_one_worker_holds(job, phase, pools, profiles, now, config)
        if limit is None or need <= limit[0]:
            continue
        held = "its prompt" if phase is Phase.PREFILL else f"prompt {job.prompt_tokens[i]} + max_tokens {job.output_cap(i)}"
        return Rejected(
            job.job_id,
            RejectCode.REQUEST_TOO_LARGE,
            f"request {job.custom_id(i)!r} needs KV for {need} tokens in {phase.slug} ({held}) on one worker, but the"
            f" largest worker of any alive pool serving {phase.slug} of {job.model!r} holds {int(limit[0])} tokens"
            f" (pool {limit[1]!r}); shorten that prompt or lower its max_tokens",
        )
    return None


def admit(
    job: JobSpec,
    backlog: Sequence[BacklogJob],
    profiles: ProfileTable,
    pools: Iterable[PoolState],
    models: Mapping[str, ModelSpec],
    quotas: Mapping[str, TenantQuota],
    config: AdmissionConfig,
    now: float,
    published_rates: Mapping[str, FleetRate] | None = None,
) -> Admitted | Rejected:
    """Admit ``job`` or reject it with a precise reason (see the module docstring).
    ``published_rates``: the fleet's rate per model as the dispatcher measured it (an admission desk's load snapshot);
    None: computed here from ``pools`` and ``profiles`` (the dispatcher's own view)."""
    invalid = _validate(job, models, now)
    if invalid is not None:
        return invalid
    prefill = sum(job.prompt_tokens)
    decode = config.expected_output_fraction * job.total_output_tokens()
    quota = quotas.get(job.tenant, config.default_quota)
    over = _check_quota(job, backlog, quota, prefill + job.total_output_tokens())
    if over is not None:
        return over
    pools = list(pools)
    rates = _Rates(pools, profiles, now, config, published_rates)
    own_rates = rates(job.model)
    work_s = _work_s(own_rates, prefill, decode, config)
    if math.isinf(work_s):
        return Rejected(
            job.job_id,
            RejectCode.NO_CAPACITY,
            f"no alive, profiled pool serves {'prefill' if own_rates[0] <= 0 else 'decode'} of {job.model!r} now",
        )
    too_large = _too_large(job, pools, profiles, now, config)
    if too_large is not None:
        return too_large
    queued, best_effort_s = _backlog_work(backlog, rates, config)
    if job.deadline is None:
        ahead = sum(q.work_s for q in queued) + best_effort_s
        return Admitted(job.job_id, now + ahead + work_s, work_s, split_job(job))
    verdict = check_deadline(queued, work_s, job.deadline, now)
    if verdict.feasible:
        return Admitted(job.job_id, verdict.completion, work_s, split_job(job))
    why = (
        f"admitting it would make on-time job {verdict.broken_job!r} late"
        if verdict.broken_job is not None
        else f"estimated completion {format_time(verdict.completion)}"
    )
    return Rejected(
        job.job_id,
        RejectCode.DEADLINE_INFEASIBLE,
        f"deadline {format_time(job.deadline)} cannot be met: {why} ({verdict.ahead_s:.1f} s of admitted work"
        f" ahead + {work_s:.1f} s for {prefill} prompt + {decode:.0f} output tokens at {own_rates[0]:.0f} prefill /"
        f" {own_rates[1]:.0f} decode tokens/s); earliest feasible deadline {format_time(verdict.earliest_deadline)}",
        verdict.earliest_deadline,
    )
