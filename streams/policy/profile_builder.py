"""Telemetry aggregates -> profile rows and link profiles.

The live profile builder computes the aggregates with ClickHouse SQL (one row per model,
phase, pool, variant and batch-size bucket: sample count, exponentially-decayed mean
throughput, step-latency quantiles, errors, memory and KV bytes per token; one row per
(src, dst) link: transfers, bytes, seconds); the simulator computes them from its own
telemetry. Both call :func:`build_profile_rows` and :func:`build_link_profiles`, which turn
them into TELEMETRY rows with a throughput-vs-batch curve. How much a row is trusted (sample
count, age) is decided later, in ``confidence``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from . import _checks
from .types import CurvePoint, LinkProfile, Phase, ProfileRow, ProfileSource, RowKey


@dataclass(frozen=True)
class PhaseAggregate:
    """Telemetry of one (model, phase, pool, variant, batch-size bucket).

    ``samples`` are observations (worker batch steps or attempts) and ``errors`` the failed
    ones among them; ``tokens_per_s`` is the decayed mean total throughput of the successful
    ones (0 when none succeeded).
    """

    model: str
    phase: Phase
    pool: str
    variant: str
    batch_size: int
    samples: int
    tokens_per_s: float
    step_p50_s: float
    step_p90_s: float
    step_p99_s: float
    errors: int
    mem_bytes_per_token: float
    kv_bytes_per_token: float
    last_seen: float
    quality_score: float | None = None  # mean canary quality vs the reference, when measured

    @property
    def key(self) -> RowKey:
        return (self.model, self.phase, self.pool, self.variant)


@dataclass(frozen=True)
class LinkAggregate:
    """KV transfers from ``src`` pool to ``dst`` pool: count, total bytes, total seconds."""

    src: str
    dst: str
    samples: int
    bytes: float
    seconds: float
    last_seen: float
    latency_s: float = 0.0  # fixed per-transfer cost, when the sink measures it separately


@dataclass(frozen=True)
class ProfileBuilderConfig:
    min_bucket_samples: int = 1
    """A bucket with fewer samples adds no curve point (its errors still count)."""
    max_age_s: float = math.inf
    """Aggregates last seen longer ago than this are dropped."""
    default_quality_score: float = 1.0
    """Quality of a pool never compared with the reference on canaries (1.0 = reference).
    Set it below the EXACT threshold to keep unmeasured pools off exact work."""
    no_success_tokens_per_s: float = 1e-6
    """Throughput recorded for a row whose samples all failed (it must stay unattractive)."""
    stale_point_s: float = 30.0
    """A curve point whose newest sample is this much older than the row's newest is stale (the
    pool has not run that batch size since); a stale point that fresher points contradict is
    dropped (see ``_drop_contradicted``)."""

    def __post_init__(self) -> None:
        owner = "ProfileBuilderConfig"
        _checks.at_least(owner, "min_bucket_samples", self.min_bucket_samples, 1)
        _checks.positive(owner, "max_age_s", self.max_age_s, allow_inf=True)
        _checks.non_negative(owner, "default_quality_score", self.default_quality_score)
        _checks.positive(owner, "no_success_tokens_per_s", self.no_success_tokens_per_s)
        _checks.positive(owner, "stale_point_s", self.stale_point_s, allow_inf=True)


def _weighted(values: Sequence[tuple[float, float]]) -> float:
    total = sum(w for _, w in values)
    return sum(v * w for v, w in values) / total if total > 0 else 0.0


def _curve(buckets: Sequence[PhaseAggregate], config: ProfileBuilderConfig) -> tuple[CurvePoint, ...]:
    by_size: dict[int, list[tuple[float, float]]] = defaultdict(list)
    seen: dict[int, float] = {}
    for b in buckets:
        if b.samples >= config.min_bucket_samples and b.tokens_per_s > 0 and b.samples > b.errors:
            size = max(1, b.batch_size)
            by_size[size].append((b.tokens_per_s, b.samples - b.errors))
            seen[size] = max(seen.get(size, -math.inf), b.last_seen)
    if not by_size:
        return (CurvePoint(1, config.no_success_tokens_per_s),)
    points = {size: _weighted(values) for size, values in sorted(by_size.items())}
    return tuple(CurvePoint(size, tps) for size, tps in _drop_contradicted(points, seen, config.stale_point_s).items())


def _drop_contradicted(points: dict[int, float], seen: dict[int, float], stale_s: float) -> dict[int, float]:
    """Drop each stale point (batch size not run for ``stale_s`` before the row's newest sample)
    that the fresh points contradict: faster than linear scaling from the nearest fresh point
    below it, or faster than the nearest fresh point above it (a pool's total throughput neither
    grows faster than its batch nor falls as the batch grows). A pool slowed at run time gets
    less work and runs smaller batches; the decay weighs samples only within their batch size,
    so its full-batch point kept the speed from before the slowdown and the router, which
    weighs pools by full-batch capacity, kept sending it work (seen in CI: a 4x slower pool at
    290 prefill tokens/s at batch 4, its fresh batches of 2 at 61). Without the point the curve
    is read flat above the last point, as for a pool never seen at full batch. A stale point no
    fresh one contradicts (a healthy pool that is merely less busy now) stays."""
    newest = max(seen.values())
    fresh = [size for size in points if seen[size] >= newest - stale_s]
    kept: dict[int, float] = {}
    for size, tps in points.items():
        below = max((f for f in fresh if f < size), default=None)
        above = min((f for f in fresh if f > size), default=None)
        contradicted = size not in fresh and (
            (below is not None and tps > points[below] * size / below) or (above is not None and tps > points[above]))
        if not contradicted:
            kept[size] = tps
    return kept


def _row(key: RowKey, buckets: Sequence[PhaseAggregate], config: ProfileBuilderConfig) -> ProfileRow:
    samples = sum(b.samples for b in buckets)
    weights = [(b, float(b.samples)) for b in buckets]
    p50 = _weighted([(b.step_p50_s, w) for b, w in weights])
    p90 = max(p50, _weighted([(b.step_p90_s, w) for b, w in weights]))
    p99 = max([p90] + [b.step_p99_s for b in buckets if b.samples >= config.min_bucket_samples])
    qualities = [(b.quality_score, w) for b, w in weights if b.quality_score is not None]
    model, phase, pool, variant = key
    return ProfileRow(
        model=model,
        phase=phase,
        pool=pool,
        variant=variant,
        curve=_curve(buckets, config),
        step_p50_s=p50,
        step_p90_s=p90,
        step_p99_s=p99,
        mem_bytes_per_token=_weighted([(b.mem_bytes_per_token, w) for b, w in weights]),
        kv_bytes_per_token=_weighted([(b.kv_bytes_per_token, w) for b, w in weights]),
        error_rate=min(1.0, sum(b.errors for b in buckets) / samples),
        quality_score=_weighted(qualities) if qualities else config.default_quality_score,
        samples=samples,
        updated_at=max(b.last_seen for b in buckets),
        source=ProfileSource.TELEMETRY,
    )


def build_profile_rows(
    aggregates: Iterable[PhaseAggregate], now: float, config: ProfileBuilderConfig | None = None
) -> list[ProfileRow]:
    """One TELEMETRY row per (model, phase, pool, variant) seen in recent aggregates, sorted by key."""
    config = config or ProfileBuilderConfig()
    groups: dict[RowKey, list[PhaseAggregate]] = defaultdict(list)
    for agg in aggregates:
        if agg.samples > 0 and now - agg.last_seen <= config.max_age_s:
            groups[agg.key].append(agg)
    return [_row(key, groups[key], config) for key in sorted(groups, key=lambda k: (k[0], k[1].value, k[2], k[3]))]


def build_link_profiles(
    aggregates: Iterable[LinkAggregate], now: float, config: ProfileBuilderConfig | None = None
) -> list[LinkProfile]:
    """One link profile per (src, dst) with transfers: bandwidth = bytes / (seconds - fixed costs)."""
    config = config or ProfileBuilderConfig()
    links = []
    for agg in aggregates:
        if agg.samples <= 0 or agg.bytes <= 0 or now - agg.last_seen > config.max_age_s:
            continue
        moving_s = agg.seconds - agg.samples * agg.latency_s
        if moving_s <= 0:
            continue
        links.append(LinkProfile(agg.src, agg.dst, agg.bytes / moving_s, agg.latency_s, agg.samples, agg.last_seen))
    return sorted(links, key=lambda link: (link.src, link.dst))
