"""Plain data the policy decides over: phases, profile rows and links, pool state, requests.

Everything here is a frozen dataclass: values that the live agents build from Kafka records
and the simulator builds from its model of the fleet. The enums ``Phase``, ``QualityTier`` and
``ProfileSource`` are the one definition in ``phaseroute.schemas.enums`` (the Avro symbols),
re-exported here. Decisions made from them
(routing decisions, admission verdicts, scheduler output, retries) live beside the code that
makes them. Validation happens at construction and names the bad value.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from phaseroute.schemas.enums import Phase as Phase
from phaseroute.schemas.enums import ProfileSource as ProfileSource
from phaseroute.schemas.enums import QualityTier as QualityTier

from . import _checks

T = TypeVar("T")


# From the most trusted (fresh measurements) to the last-resort prior.
SOURCE_PRIORITY: tuple[ProfileSource, ...] = (ProfileSource.TELEMETRY, ProfileSource.PROFILER, ProfileSource.DATASHEET)

RowKey = tuple[str, Phase, str, str]  # (model, phase, pool, variant)


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """Measured total throughput (tokens/s over the whole batch) at one batch size."""

    batch_size: int
    tokens_per_s: float

    def __post_init__(self) -> None:
        _checks.at_least("CurvePoint", "batch_size", self.batch_size, 1)
        _checks.positive("CurvePoint", "tokens_per_s", self.tokens_per_s)


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """Measured behaviour of one (model, phase, pool, variant). Confidence is derived, never stored."""

    model: str
    phase: Phase
    pool: str
    variant: str
    curve: tuple[CurvePoint, ...]
    step_p50_s: float
    step_p90_s: float
    step_p99_s: float
    mem_bytes_per_token: float
    kv_bytes_per_token: float
    error_rate: float
    quality_score: float
    samples: int
    updated_at: float
    source: ProfileSource
    _sizes: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        owner = f"ProfileRow({self.model}, {self.phase.slug}, {self.pool})"
        if not self.curve:
            raise ValueError(f"{owner}.curve must have at least one point, got ()")
        sizes = [p.batch_size for p in self.curve]
        if sizes != sorted(set(sizes)):
            raise ValueError(f"{owner}.curve batch sizes must be strictly increasing, got {sizes}")
        object.__setattr__(self, "_sizes", tuple(sizes))  # cached for tokens_per_s
        for name in ("step_p50_s", "step_p90_s", "step_p99_s", "mem_bytes_per_token", "kv_bytes_per_token"):
            _checks.non_negative(owner, name, getattr(self, name))
        if not self.step_p50_s <= self.step_p90_s <= self.step_p99_s:
            raise ValueError(
                f"{owner} latency quantiles must satisfy p50 <= p90 <= p99, got "
                f"{self.step_p50_s}, {self.step_p90_s}, {self.step_p99_s}"
            )
        _checks.fraction(owner, "error_rate", self.error_rate)
        _checks.non_negative(owner, "quality_score", self.quality_score)
        _checks.non_negative(owner, "samples", self.samples)
        _checks.finite(owner, "updated_at", self.updated_at)

    @property
    def key(self) -> RowKey:
        return (self.model, self.phase, self.pool, self.variant)

    @property
    def max_batch_size(self) -> int:
        return self.curve[-1].batch_size

    def tokens_per_s(self, batch_size: int) -> float:
        """Total throughput at ``batch_size``: linear between points, flat above the last,
        proportional to the batch size below the first (one sequence's rate is kept)."""
        sizes = self._sizes
        if batch_size <= sizes[0]:
            first = self.curve[0]
            return first.tokens_per_s * max(batch_size, 1) / first.batch_size
        if batch_size >= sizes[-1]:
            return self.curve[-1].tokens_per_s
        i = bisect.bisect_left(sizes, batch_size)
        lo, hi = self.curve[i - 1], self.curve[i]
        t = (batch_size - lo.batch_size) / (hi.batch_size - lo.batch_size)
        return lo.tokens_per_s + t * (hi.tokens_per_s - lo.tokens_per_s)


@dataclass(frozen=True, slots=True)
class LinkProfile:
    """Measured KV transfer from ``src`` pool to ``dst`` pool."""

    src: str
    dst: str
    bytes_per_s: float
    latency_s: float
    samples: int
    updated_at: float

    def __post_init__(self) -> None:
        owner = f"LinkProfile({self.src}->{self.dst})"
        _checks.positive(owner, "bytes_per_s", self.bytes_per_s)
        _checks.non_negative(owner, "latency_s", self.latency_s)
        _checks.non_negative(owner, "samples", self.samples)
        _checks.finite(owner, "updated_at", self.updated_at)


@dataclass(frozen=True, slots=True)
class PathQuality:
    """Measured quality of one path for one model: prefill on ``src``, KV moved, decode on
    ``dst`` (colocated when equal), from canaries compared with the reference (drift monitor)."""

    model: str
    src: str
    dst: str
    score: float  # 1.0 = the reference (teacher-forced top-1 agreement)
    exact_ok: bool  # the quality policy's verdict: may take EXACT-tier work
    samples: int  # reference positions compared
    updated_at: float

    def __post_init__(self) -> None:
        owner = f"PathQuality({self.model}, {self.src}->{self.dst})"
        _checks.fraction(owner, "score", self.score)
        _checks.non_negative(owner, "samples", self.samples)
        _checks.finite(owner, "updated_at", self.updated_at)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.model, self.src, self.dst)


@dataclass(frozen=True, slots=True)
class ProfileTable:
    """Rows by (model, phase, pool, variant) and source; links by (src, dst); measured path
    quality by (model, src, dst)."""

    rows: Mapping[tuple[str, Phase, str, str, ProfileSource], ProfileRow] = field(default_factory=dict)
    links: Mapping[tuple[str, str], LinkProfile] = field(default_factory=dict)
    quality: Mapping[tuple[str, str, str], PathQuality] = field(default_factory=dict)
    # Values derived from this immutable table at one time ``now`` (see ``memo``).
    _memo: dict[Hashable, object] = field(default_factory=dict, init=False, repr=False, compare=False)
    _memo_now: list[float] = field(default_factory=list, init=False, repr=False, compare=False)

    @classmethod
    def from_rows(cls, rows: Iterable[ProfileRow], links: Iterable[LinkProfile] = (),
                  quality: Iterable[PathQuality] = ()) -> ProfileTable:
        return cls().with_rows(rows, links, quality)

    def with_rows(self, rows: Iterable[ProfileRow] = (), links: Iterable[LinkProfile] = (),
                  quality: Iterable[PathQuality] = ()) -> ProfileTable:
        """A new table where ``rows``, ``links`` and ``quality`` replace those with the same key."""
        new_rows = dict(self.rows)
        new_rows.update({(*row.key, row.source): row for row in rows})
        new_links = dict(self.links)
        new_links.update({(link.src, link.dst): link for link in links})
        new_quality = dict(self.quality)
        new_quality.update({q.key: q for q in quality})
        return ProfileTable(new_rows, new_links, new_quality)

    def rows_for(self, model: str, phase: Phase, pool: str, variant: str) -> dict[ProfileSource, ProfileRow]:
        found = {}
        for source in SOURCE_PRIORITY:
            row = self.rows.get((model, phase, pool, variant, source))
            if row is not None:
                found[source] = row
        return found

    def link(self, src: str, dst: str) -> LinkProfile | None:
        return self.links.get((src, dst))

    def memo(self, key: Hashable, now: float, compute: Callable[[], T]) -> T:
        """``compute()`` once per ``key`` at time ``now``. The table never changes, so a value
        derived from it at ``now`` never changes either; only the latest ``now`` is kept, so the
        cache stays small while many requests are routed at the same time."""
        memo = self._memo
        if not self._memo_now or self._memo_now[0] != now:
            memo.clear()
            self._memo_now[:] = [now]
        try:
            return memo[key]  # type: ignore[return-value]
        except KeyError:
            value = memo[key] = compute()
            return value


_PLAIN_NUMBERS = (int, float)


@dataclass(frozen=True, slots=True)
class PoolState:
    """What the router knows of a pool now (from heartbeats and consumer lag)."""

    name: str
    alive: bool
    phases: frozenset[Phase]
    models: frozenset[str]
    variant: str
    workers: int
    max_batch: int
    free_kv_bytes: float
    queue_requests: int = 0
    queue_tokens: int = 0
    in_flight: int = 0
    recent_failures: int = 0
    last_heartbeat: float = 0.0
    price_per_hour: float | None = None  # $ per hour for the whole pool, when known
    worker_free_kv_bytes: float | None = None
    """The most KV memory free on any one alive worker now (a request's KV lives on one worker,
    so the pool's sum can hide that no worker has room); None when the pool view does not know."""
    worker_kv_capacity_bytes: float | None = None
    """The most KV memory any one alive worker has when empty: a request needing more can never
    run on this pool; None when the pool view does not know."""
    kv_format: str | None = None
    """The KV cache layout its workers write and read (model, dtype, shape, blob version): a KV
    cache moves between two pools only when both say the same; None: unknown (never paired)."""

    def __post_init__(self) -> None:
        # The router sees a fresh PoolState per pool per decision: check the common (valid) case
        # in one pass, and name the bad field only when something is off.
        numbers = (self.workers, self.max_batch, self.free_kv_bytes, self.queue_requests, self.queue_tokens,
                   self.in_flight, self.recent_failures)
        optional = (self.price_per_hour, self.worker_free_kv_bytes, self.worker_kv_capacity_bytes)
        if (
            type(self.name) is str and self.name.strip() and self.max_batch >= 1
            and all(type(v) in _PLAIN_NUMBERS and 0 <= v < math.inf for v in numbers)
            and all(v is None or (type(v) in _PLAIN_NUMBERS and 0 <= v < math.inf) for v in optional)
        ):
            return
        owner = f"PoolState({self.name})"
        _checks.non_empty("PoolState", "name", self.name)
        _checks.non_negative(owner, "workers", self.workers)
        _checks.at_least(owner, "max_batch", self.max_batch, 1)
        for name in ("free_kv_bytes", "queue_requests", "queue_tokens", "in_flight", "recent_failures"):
            _checks.non_negative(owner, name, getattr(self, name))
        for name in ("price_per_hour", "worker_free_kv_bytes", "worker_kv_capacity_bytes"):
            if getattr(self, name) is not None:
                _checks.non_negative(owner, name, getattr(self, name))

    def serves(self, phase: Phase) -> bool:
        return phase in self.phases


@dataclass(frozen=True, slots=True)
class RequestWork:
    """One prompt of a job, as the scheduler and the router see it."""

    request_id: str
    job_id: str
    tenant: str
    model: str
    prompt_tokens: int
    max_output_tokens: int
    deadline: float | None = None
    quality_tier: QualityTier = QualityTier.EXACT
    quality_tolerance: float = 0.0  # APPROXIMATE accepts quality >= 1 - tolerance
    attempt: int = 0
    avoid_pools: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        # One per prompt of every admitted job: check the common (valid) case in one pass, and
        # name the bad field only when something is off.
        deadline = self.deadline
        if (
            type(self.request_id) is str and self.request_id.strip()
            and type(self.prompt_tokens) is int and self.prompt_tokens >= 1
            and type(self.max_output_tokens) is int and self.max_output_tokens >= 1
            and type(self.quality_tolerance) in _PLAIN_NUMBERS and 0.0 <= self.quality_tolerance <= 1.0
            and type(self.attempt) is int and self.attempt >= 0
            and (deadline is None or (type(deadline) in _PLAIN_NUMBERS and math.isfinite(deadline)))
        ):
            return
        owner = f"RequestWork({self.request_id})"
        _checks.non_empty("RequestWork", "request_id", self.request_id)
        _checks.at_least(owner, "prompt_tokens", self.prompt_tokens, 1)
        _checks.at_least(owner, "max_output_tokens", self.max_output_tokens, 1)
        _checks.fraction(owner, "quality_tolerance", self.quality_tolerance)
        _checks.non_negative(owner, "attempt", self.attempt)
        if self.deadline is not None:
            _checks.finite(owner, "deadline", self.deadline)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.max_output_tokens


class PathEstimate(NamedTuple):
    """The cost model's view of one placement: seconds per stage, KV bytes moved, money, risk.

    A named tuple rather than a frozen dataclass: the router builds one per candidate path of
    every request (16 for four pools), and a tuple is immutable at a third of the cost."""

    prefill_pool: str
    decode_pool: str
    prefill_wait_s: float
    prefill_s: float
    transfer_s: float
    decode_wait_s: float
    decode_s: float
    kv_bytes: float
    cost: float | None  # dollars, None when a pool on the path carries no price
    quality: float
    success_prob: float
    memory_headroom: float  # 1 - needed / free on the tighter pool, in [0, 1]
    stall_s: float  # decode-seconds the prefill stalls on a pool that also decodes

    @property
    def colocated(self) -> bool:
        return self.prefill_pool == self.decode_pool

    @property
    def total_s(self) -> float:
        return self.prefill_wait_s + self.prefill_s + self.transfer_s + self.decode_wait_s + self.decode_s


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    """Where a request runs: the prefill pool, the decode pool (the same pool when colocated)."""

    request_id: str
    prefill_pool: str
    decode_pool: str
    colocated: bool
    estimated_completion: float
    estimate: PathEstimate
    scores: tuple[tuple[str, float], ...]  # per-scorer value in [0, 1]
    score: float  # weighted mean of ``scores``
    explored: bool
    rejected: tuple[tuple[str, str], ...] = ()  # (pool/phase, why it was filtered)
    eligible_prefill: tuple[str, ...] = ()  # pools that passed the filters, for RouterState.record
    eligible_decode: tuple[str, ...] = ()
    rival: PathEstimate | None = None  # the best path of the other kind (colocated / disaggregated)
    rival_score: float = 0.0
    passed_over: int = 0  # better-scored paths passed over (their pool was above its traffic share)

    @property
    def reason(self) -> str:
        """Why this path, in words: the estimate, the best alternative of the other kind, and
        whether it was an exploration pick or passed better paths over (formatted when read:
        the router decides far more often than anyone reads why)."""
        text = f"{_describe_path(self.estimate)}, score {self.score:.3f}"
        if self.rival is not None:
            r = self.rival
            text += f"; best {'colocated' if r.colocated else 'disaggregated'} alternative: "
            text += f"{_describe_path(r)}, score {self.rival_score:.3f}"
        if self.explored:
            text += "; exploration pick"
        elif self.passed_over:
            text += f"; {self.passed_over} better-scored path(s) passed over (pool above its traffic share)"
        return text


def _describe_path(e: PathEstimate) -> str:
    where = f"colocated on {e.prefill_pool}" if e.colocated else f"disaggregated {e.prefill_pool} -> {e.decode_pool}"
    return (
        f"{where}: est {e.total_s:.3g} s (wait {e.prefill_wait_s + e.decode_wait_s:.3g} + prefill {e.prefill_s:.3g}"
        f" + transfer {e.transfer_s:.3g} + decode {e.decode_s:.3g})"
    )


@dataclass(frozen=True, slots=True)
class NoPlacement:
    """No pool can take the request now; ``reason`` says why, ``rejected`` per pool."""

    request_id: str
    reason: str
    rejected: tuple[tuple[str, str], ...] = ()

    def explain(self) -> str:
        """The reason and every pool's (or path's) refusal, for a user-facing error."""
        return "; ".join([self.reason, *(f"{where}: {why}" for where, why in self.rejected)])
