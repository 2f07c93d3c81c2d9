"""Router filters: drop the pools (per phase) and paths a request must not use.

Each filter is a small function of one :class:`FilterInput` that returns None (keep) or a
reason a person can act on (drop). ``POOL_FILTERS`` runs them in order and stops at the
first reason; ``path_filter`` checks what only a whole path knows: quality over both phases,
or the quality canaries measured on the path (``quality.path_quality``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .confidence import EffectiveProfile, effective_profile
from .cost_model import PhaseOption, kv_need_bytes
from .router_config import RouterConfig
from .types import PathEstimate, PathQuality, Phase, PoolState, ProfileTable, QualityTier, RequestWork


@dataclass(frozen=True, slots=True)
class FilterInput:
    request: RequestWork
    pool: PoolState
    phase: Phase
    profile: EffectiveProfile | None
    now: float
    config: RouterConfig


Filter = Callable[[FilterInput], "str | None"]


def required_quality(request: RequestWork, config: RouterConfig) -> float:
    """Lowest acceptable quality score: the EXACT threshold, or 1 - tolerance for APPROXIMATE."""
    if request.quality_tier is QualityTier.EXACT:
        return config.exact_quality_threshold
    return min(config.exact_quality_threshold, 1.0 - request.quality_tolerance)


def alive(x: FilterInput) -> str | None:
    if not x.pool.alive:
        return "pool is not alive"
    if x.pool.workers < 1:
        return "pool has no workers"
    silent = x.now - x.pool.last_heartbeat
    if silent > x.config.heartbeat_timeout_s:
        return f"no heartbeat for {silent:.1f} s (timeout {x.config.heartbeat_timeout_s:.1f} s)"
    return None


def serves_phase(x: FilterInput) -> str | None:
    if x.pool.serves(x.phase):
        return None
    return f"does not serve {x.phase.slug} (serves {sorted(p.slug for p in x.pool.phases)})"


def model_loaded(x: FilterInput) -> str | None:
    if x.request.model in x.pool.models:
        return None
    return f"model {x.request.model!r} not loaded (loaded: {sorted(x.pool.models)})"


def has_profile(x: FilterInput) -> str | None:
    if x.profile is not None:
        return None
    return f"no profile row for ({x.request.model}, {x.phase.slug}, variant {x.pool.variant!r})"


def healthy(x: FilterInput) -> str | None:
    assert x.profile is not None
    rate = x.profile.row.error_rate
    if rate < x.config.max_error_rate:
        return None
    return f"measured error rate {rate:.2f} >= max {x.config.max_error_rate:.2f}"


def quality(x: FilterInput) -> str | None:
    assert x.profile is not None
    score, need = x.profile.row.quality_score, required_quality(x.request, x.config)
    if score >= need:
        return None
    return f"quality {score:.3f} < {need:.3f} required by {x.request.quality_tier.value} tier"


def memory(x: FilterInput) -> str | None:
    """The request's KV must fit in the pool's free memory, and in one worker's KV memory when
    the pool view knows its workers' capacity: a sequence bigger than any one worker can hold
    never runs there, however much the pool has in all."""
    assert x.profile is not None
    need = kv_need_bytes(x.request, x.profile.row, x.phase)
    if need > x.pool.free_kv_bytes:
        return f"needs {need:.0f} KV bytes, {x.pool.free_kv_bytes:.0f} free"
    capacity = x.pool.worker_kv_capacity_bytes
    if capacity is not None and need > capacity:
        return f"needs {need:.0f} KV bytes on one worker, a worker of this pool holds at most {capacity:.0f}"
    return None


def room_now(x: FilterInput) -> str | None:
    """Some worker of the pool has room for the request's KV now (when the pool view knows):
    a request sent to a pool whose workers are all full waits there behind the work that
    fills them. When no pool has room now, the router relaxes this filter
    (``RouterConfig.relax_room_when_empty``) and the request queues where it can run at all."""
    assert x.profile is not None
    worker_free = x.pool.worker_free_kv_bytes
    if worker_free is None:
        return None
    need = kv_need_bytes(x.request, x.profile.row, x.phase)
    if need <= worker_free:
        return None
    return f"needs {need:.0f} KV bytes on one worker, at most {worker_free:.0f} free on any worker now"


def not_avoided(x: FilterInput) -> str | None:
    if x.pool.name not in x.request.avoid_pools:
        return None
    return "in the request's avoid list (failed it before)"


POOL_FILTERS: tuple[tuple[str, Filter], ...] = (
    ("alive", alive),
    ("serves_phase", serves_phase),
    ("model_loaded", model_loaded),
    ("has_profile", has_profile),
    ("healthy", healthy),
    ("quality", quality),
    ("memory", memory),
    ("room_now", room_now),
    ("not_avoided", not_avoided),
)


@functools.lru_cache(maxsize=16)
def _filters_without(skip: frozenset[str]) -> tuple[tuple[str, Filter], ...]:
    return tuple((name, check) for name, check in POOL_FILTERS if name not in skip)


def first_rejection(x: FilterInput, *, skip: frozenset[str] = frozenset()) -> str | None:
    for name, check in _filters_without(skip):
        reason = check(x)
        if reason is not None:
            return f"{name}: {reason}"
    return None


def phase_options(
    request: RequestWork,
    pools: Iterable[PoolState],
    profiles: ProfileTable,
    phase: Phase,
    now: float,
    config: RouterConfig,
    *,
    skip: frozenset[str] = frozenset(),
) -> tuple[list[PhaseOption], list[tuple[str, str]]]:
    """Pools that pass every filter for ``phase`` (with their effective rows), and why the rest failed."""
    kept: list[PhaseOption] = []
    rejected: list[tuple[str, str]] = []
    for pool in pools:
        profile = None
        if pool.serves(phase) and request.model in pool.models:
            profile = effective_profile(profiles, request.model, phase, pool.name, pool.variant, now, config.confidence)
        reason = first_rejection(FilterInput(request, pool, phase, profile, now, config), skip=skip)
        if reason is None and profile is not None:
            kept.append(PhaseOption(pool, phase, profile.row, profile.confidence))
        elif reason is not None and pool.serves(phase):
            rejected.append((f"{pool.name}/{phase.slug}", reason))
    return kept, rejected


def kv_handover(prefill: PoolState, decode: PoolState) -> str | None:
    """None when a KV cache prefilled on ``prefill`` can be decoded on ``decode``, else why not:
    both pools must report the same KV format (a decode worker refuses any other layout)."""
    if prefill.name == decode.name:
        return None
    if prefill.kv_format is None or decode.kv_format is None:
        unknown = prefill.name if prefill.kv_format is None else decode.name
        return f"KV format of {unknown} unknown (its workers do not report one): only colocated placement is safe"
    if prefill.kv_format != decode.kv_format:
        return f"KV formats differ: {prefill.kv_format} vs {decode.kv_format}"
    return None


def path_filter(request: RequestWork, estimate: PathEstimate, config: RouterConfig,
                measured: PathQuality | None = None) -> str | None:
    """None when the whole path is acceptable, else why not. With a measured (or inferred)
    path quality from canaries, EXACT needs the quality policy's verdict (``exact_ok``) and
    APPROXIMATE needs its score >= 1 - tolerance; without one, the rows' scores decide."""
    if measured is not None:
        where = "measured" if measured.samples else "inferred from the pools' measured paths"
        if request.quality_tier is QualityTier.EXACT:
            if measured.exact_ok:
                return None
            return f"path demoted for exact tier by canary drift ({where}; top-1 agreement {measured.score:.3f})"
        need = 1.0 - request.quality_tolerance
        if measured.score >= need:
            return None
        return f"path quality {measured.score:.3f} ({where}) < {need:.3f} required by approximate tier"
    need = required_quality(request, config)
    if estimate.quality < need:
        return f"path quality {estimate.quality:.3f} < {need:.3f} required by {request.quality_tier.value} tier"
    return None
