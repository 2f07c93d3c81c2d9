"""Router filters: drop the pools (per phase) and paths a request must not use.

Each filter is a small function that returns None (keep) or a reason a person can act on
(drop). Those that do not depend on the request (``POOL_FILTERS``: alive, serves the phase,
model loaded, profiled, healthy) read a :class:`PoolInput`, so the router can run them once
per pool state (``phase_view``); then ``request_rejection`` runs those that do (quality tier,
KV memory, room now, avoid list: ``REQUEST_FILTERS``); each stops at the first reason.
``phase_view.phase_costs`` runs both for every pool of a phase. ``path_filter`` checks what
only a whole path knows: quality over both phases, or the quality canaries measured on the
path (``quality.path_quality``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

from .confidence import EffectiveProfile
from .cost_model import kv_need_bytes
from .router_config import RouterConfig
from .types import PathEstimate, PathQuality, Phase, PoolState, ProfileRow, QualityTier, RequestWork


class PoolInput(NamedTuple):
    """What the request-independent filters read: one pool for one phase of one model at ``now``
    (built for every pool view the router makes: a tuple is cheap to build)."""

    pool: PoolState
    phase: Phase
    model: str
    profile: EffectiveProfile | None
    now: float
    config: RouterConfig


PoolFilter = Callable[[PoolInput], "str | None"]


def required_quality(request: RequestWork, config: RouterConfig) -> float:
    """Lowest acceptable quality score: the EXACT threshold, or 1 - tolerance for APPROXIMATE."""
    if request.quality_tier is QualityTier.EXACT:
        return config.exact_quality_threshold
    return min(config.exact_quality_threshold, 1.0 - request.quality_tolerance)


def alive(x: PoolInput) -> str | None:
    if not x.pool.alive:
        return "pool is not alive"
    if x.pool.workers < 1:
        return "pool has no workers"
    silent = x.now - x.pool.last_heartbeat
    if silent > x.config.heartbeat_timeout_s:
        return f"no heartbeat for {silent:.1f} s (timeout {x.config.heartbeat_timeout_s:.1f} s)"
    return None


def serves_phase(x: PoolInput) -> str | None:
    if x.pool.serves(x.phase):
        return None
    return f"does not serve {x.phase.slug} (serves {sorted(p.slug for p in x.pool.phases)})"


def model_loaded(x: PoolInput) -> str | None:
    if x.model in x.pool.models:
        return None
    return f"model {x.model!r} not loaded (loaded: {sorted(x.pool.models)})"


def has_profile(x: PoolInput) -> str | None:
    if x.profile is not None:
        return None
    return f"no profile row for ({x.model}, {x.phase.slug}, variant {x.pool.variant!r})"


def healthy(x: PoolInput) -> str | None:
    assert x.profile is not None
    rate = x.profile.row.error_rate
    if rate < x.config.max_error_rate:
        return None
    return f"measured error rate {rate:.2f} >= max {x.config.max_error_rate:.2f}"


POOL_FILTERS: tuple[tuple[str, PoolFilter], ...] = (
    ("alive", alive),
    ("serves_phase", serves_phase),
    ("model_loaded", model_loaded),
    ("has_profile", has_profile),
    ("healthy", healthy),
)
REQUEST_FILTERS = ("quality", "memory", "room_now", "not_avoided")  # run after POOL_FILTERS, in this order


@functools.lru_cache(maxsize=16)
def _filters_without(skip: frozenset[str]) -> tuple[tuple[str, PoolFilter], ...]:
    return tuple((name, check) for name, check in POOL_FILTERS if name not in skip)


def pool_rejection(x: PoolInput, *, skip: frozenset[str] = frozenset()) -> str | None:
    """The first of ``POOL_FILTERS`` (not in ``skip``) the pool fails, as "name: reason", or None."""
    for name, check in _filters_without(skip):
        reason = check(x)
        if reason is not None:
            return f"{name}: {reason}"
    return None


def request_rejection(request: RequestWork, pool: PoolState, row: ProfileRow, phase: Phase,
                      config: RouterConfig, *, skip: frozenset[str] = frozenset()) -> str | None:
    """The first of ``REQUEST_FILTERS`` (not in ``skip``) the request fails on a pool that passed
    ``POOL_FILTERS`` with effective row ``row``, as "name: reason", or None. In order:

    - quality: the row's quality score meets the request's tier (``required_quality``);
    - memory: the request's KV fits in the pool's free memory, and in one worker's KV memory
      when the pool view knows its workers' capacity (a sequence bigger than any one worker
      can hold never runs there, however much the pool has in all);
    - room_now: some worker has room for it now, when the pool view knows (a request sent to
      a pool whose workers are all full waits there behind the work that fills them; when no
      pool has room now the router relaxes this filter, ``RouterConfig.relax_room_when_empty``,
      and the request queues where it can run at all);
    - not_avoided: the pool is not in the request's avoid list (it failed the request before).

    One function rather than one per filter: it runs for every pool of every request."""
    if "quality" not in skip:
        score, need_quality = row.quality_score, required_quality(request, config)
        if not score >= need_quality:
            return (f"quality: quality {score:.3f} < {need_quality:.3f} required by "
                    f"{request.quality_tier.value} tier")
    need = kv_need_bytes(request, row, phase)
    if "memory" not in skip:
        if need > pool.free_kv_bytes:
            return f"memory: needs {need:.0f} KV bytes, {pool.free_kv_bytes:.0f} free"
        capacity = pool.worker_kv_capacity_bytes
        if capacity is not None and need > capacity:
            return (f"memory: needs {need:.0f} KV bytes on one worker, a worker of this pool holds "
                    f"at most {capacity:.0f}")
    if "room_now" not in skip:
        worker_free = pool.worker_free_kv_bytes
        if worker_free is not None and not need <= worker_free:
            return f"room_now: needs {need:.0f} KV bytes on one worker, at most {worker_free:.0f} free on any worker now"
    if "not_avoided" not in skip and pool.name in request.avoid_pools:
        return "not_avoided: in the request's avoid list (failed it before)"
    return None


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


def measured_quality_refusal(request: RequestWork, measured: PathQuality) -> str | None:
    """None when the canaries' (measured or inferred) quality of a path allows the request's
    tier there, else why not: EXACT needs ``exact_ok``, APPROXIMATE a score >= 1 - tolerance."""
    where = "measured" if measured.samples else "inferred from the pools' measured paths"
    if request.quality_tier is QualityTier.EXACT:
        if measured.exact_ok:
            return None
        return f"path demoted for exact tier by canary drift ({where}; top-1 agreement {measured.score:.3f})"
    need = 1.0 - request.quality_tolerance
    if measured.score >= need:
        return None
    return f"path quality {measured.score:.3f} ({where}) < {need:.3f} required by approximate tier"


def path_filter(request: RequestWork, estimate: PathEstimate, config: RouterConfig,
                measured: PathQuality | None = None) -> str | None:
    """None when the whole path is acceptable, else why not. With a measured (or inferred)
    path quality from canaries, EXACT needs the quality policy's verdict (``exact_ok``) and
    APPROXIMATE needs its score >= 1 - tolerance; without one, the rows' scores decide."""
    if measured is not None:
        return measured_quality_refusal(request, measured)
    need = required_quality(request, config)
    if estimate.quality < need:
        return f"path quality {estimate.quality:.3f} < {need:.3f} required by {request.quality_tier.value} tier"
    return None
