"""How much to trust a profile row, and the effective row the router actually uses.

Confidence = (1 - exp(-samples / samples_scale)) * 0.5 ** (age / half_life), where age is
``now - updated_at`` and the half-life depends on the row's source. The effective row for a
(model, phase, pool, variant) starts from the least trusted row present (DATASHEET, else
PROFILER, else TELEMETRY) and blends each more trusted row over it with weight = that row's
confidence (rows under ``min_confidence`` are skipped). So a cold-start PROFILER row is used
until telemetry has enough samples, and telemetry that stops arriving fades back toward the
prior instead of being trusted forever. Links blend the same way toward a configured prior.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from . import _checks
from .types import SOURCE_PRIORITY, CurvePoint, LinkProfile, Phase, ProfileRow, ProfileSource, ProfileTable


@dataclass(frozen=True)
class ConfidenceConfig:
    samples_scale: float = 20.0
    """Samples at which the sample factor reaches 1 - 1/e (~0.63); 3x this gives ~0.95."""
    telemetry_half_life_s: float = 600.0
    """Age at which a TELEMETRY row's confidence halves."""
    profiler_half_life_s: float = math.inf
    """Age at which a PROFILER (cold-start microbenchmark) row's confidence halves; inf = never."""
    min_confidence: float = 0.05
    """Rows below this confidence are ignored (the prior is used alone)."""
    link_prior_bytes_per_s: float = 1.0e9
    """Assumed KV transfer bandwidth of a link never measured."""
    link_prior_latency_s: float = 0.01
    """Assumed fixed cost of one KV transfer on a link never measured."""

    _hash: int = field(init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        return self._hash  # the router hashes its config into cache keys on every lookup

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self) if f.compare)))
        owner = "ConfidenceConfig"
        _checks.positive(owner, "samples_scale", self.samples_scale)
        _checks.positive(owner, "telemetry_half_life_s", self.telemetry_half_life_s, allow_inf=True)
        _checks.positive(owner, "profiler_half_life_s", self.profiler_half_life_s, allow_inf=True)
        _checks.fraction(owner, "min_confidence", self.min_confidence)
        _checks.positive(owner, "link_prior_bytes_per_s", self.link_prior_bytes_per_s)
        _checks.non_negative(owner, "link_prior_latency_s", self.link_prior_latency_s)

    def half_life(self, source: ProfileSource) -> float:
        if source is ProfileSource.TELEMETRY:
            return self.telemetry_half_life_s
        if source is ProfileSource.PROFILER:
            return self.profiler_half_life_s
        return math.inf


@dataclass(frozen=True)
class EffectiveProfile:
    """The blended row, the confidence of its most trusted source, and telemetry's share in it."""

    row: ProfileRow
    confidence: float
    telemetry_weight: float


def confidence(samples: float, age_s: float, half_life_s: float, config: ConfidenceConfig) -> float:
    """Confidence in [0, 1] from sample count and age (negative ages count as 0)."""
    sample_factor = 1.0 - math.exp(-max(samples, 0.0) / config.samples_scale)
    age_factor = 1.0 if math.isinf(half_life_s) else 0.5 ** (max(age_s, 0.0) / half_life_s)
    return sample_factor * age_factor


def row_confidence(row: ProfileRow, now: float, config: ConfidenceConfig) -> float:
    return confidence(row.samples, now - row.updated_at, config.half_life(row.source), config)


def blend_rows(trusted: ProfileRow, prior: ProfileRow, weight: float) -> ProfileRow:
    """``weight * trusted + (1 - weight) * prior``, field by field (throughput as seconds per
    token), over the union of the two curves' batch sizes."""
    sizes = sorted({p.batch_size for p in trusted.curve} | {p.batch_size for p in prior.curve})

    def mix(a: float, b: float) -> float:
        return weight * a + (1.0 - weight) * b

    def mix_rate(a: float, b: float) -> float:  # blend seconds per token, so slowness is not averaged away
        return 1.0 / mix(1.0 / a, 1.0 / b)

    curve = tuple(CurvePoint(b, mix_rate(trusted.tokens_per_s(b), prior.tokens_per_s(b))) for b in sizes)
    return replace(
        trusted,
        curve=curve,
        step_p50_s=mix(trusted.step_p50_s, prior.step_p50_s),
        step_p90_s=mix(trusted.step_p90_s, prior.step_p90_s),
        step_p99_s=mix(trusted.step_p99_s, prior.step_p99_s),
        mem_bytes_per_token=mix(trusted.mem_bytes_per_token, prior.mem_bytes_per_token),
        kv_bytes_per_token=mix(trusted.kv_bytes_per_token, prior.kv_bytes_per_token),
        error_rate=min(1.0, max(0.0, mix(trusted.error_rate, prior.error_rate))),
        quality_score=mix(trusted.quality_score, prior.quality_score),
        samples=trusted.samples + prior.samples,
        updated_at=max(trusted.updated_at, prior.updated_at),
        source=trusted.source if weight >= 0.5 else prior.source,
    )


def effective_profile(
    table: ProfileTable, model: str, phase: Phase, pool: str, variant: str, now: float, config: ConfidenceConfig
) -> EffectiveProfile | None:
    """The row the router uses for (model, phase, pool, variant), or None when nothing is known."""
    key = ("effective_profile", model, phase, pool, variant, config)
    return table.memo(key, now, lambda: _blend_sources(table, model, phase, pool, variant, now, config))


def _blend_sources(
    table: ProfileTable, model: str, phase: Phase, pool: str, variant: str, now: float, config: ConfidenceConfig
) -> EffectiveProfile | None:
    found = table.rows_for(model, phase, pool, variant)
    if not found:
        return None
    ordered = [found[s] for s in reversed(SOURCE_PRIORITY) if s in found]  # least trusted first
    current = ordered[0]
    top_confidence = row_confidence(current, now, config)
    telemetry_weight = 1.0 if current.source is ProfileSource.TELEMETRY else 0.0
    for row in ordered[1:]:
        c = row_confidence(row, now, config)
        if c < config.min_confidence:
            continue
        current = blend_rows(row, current, c)
        top_confidence = c
        telemetry_weight = c if row.source is ProfileSource.TELEMETRY else telemetry_weight * (1.0 - c)
    return EffectiveProfile(current, top_confidence, telemetry_weight)


def effective_link(table: ProfileTable, src: str, dst: str, now: float, config: ConfidenceConfig) -> LinkProfile:
    """The measured link blended toward the configured prior by its confidence."""
    key = ("effective_link", src, dst, config)
    return table.memo(key, now, lambda: _blend_link(table, src, dst, now, config))


def _blend_link(table: ProfileTable, src: str, dst: str, now: float, config: ConfidenceConfig) -> LinkProfile:
    prior = LinkProfile(src, dst, config.link_prior_bytes_per_s, config.link_prior_latency_s, 0, now)
    link = table.link(src, dst)
    if link is None:
        return prior
    c = confidence(link.samples, now - link.updated_at, config.telemetry_half_life_s, config)
    if c < config.min_confidence:
        return prior
    # Blend transfer *times* per byte (not bandwidths) so a slow link is not averaged away.
    per_byte = c / link.bytes_per_s + (1.0 - c) / prior.bytes_per_s
    latency = c * link.latency_s + (1.0 - c) * prior.latency_s
    return LinkProfile(src, dst, 1.0 / per_byte, latency, link.samples, link.updated_at)
