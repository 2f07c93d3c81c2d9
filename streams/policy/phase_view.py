"""One pool for one phase as the router sees it at one time, and each request's cost there.

The router filters and costs every pool for every request (``filters.phase_options`` then
``cost_model.phase_cost``). Much of that does not depend on the request: the pool's effective
profile row, whether it is alive, fresh, healthy and serves the phase and model, the batch a new
request joins and the throughput there, the pool's capacity and price per worker-second. A
:class:`PhaseView` holds those for one (pool state, phase, model, router config) at the
profile table's ``now`` (kept with the table's other values derived at ``now``, ``ProfileTable.memo``),
so the requests routed in one tick share it until the pool's state changes (a dispatch there
gives it a new ``PoolState``: the view is rebuilt for it).

``phase_costs`` is ``phase_options`` followed by ``phase_cost`` for each kept pool, from the
views: the same filters with the same comparisons, the same arithmetic in the same order, so
the options, costs and rejections are exactly those of the two functions (a pool the quick
check does not keep goes through ``filters.first_rejection`` for its reason, as there).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from .confidence import effective_profile
from .cost_model import PhaseCost, PhaseOption, phase_cost
from .filters import FilterInput, first_rejection, required_quality
from .router_config import RouterConfig
from .types import Phase, PoolState, ProfileRow, ProfileTable, RequestWork

_QUICK_SKIPS = frozenset({"room_now", "not_avoided"})  # the filters the quick check can leave out


class PhaseView(NamedTuple):
    """What does not depend on the request, for one pool and phase (see the module docstring)."""

    pool: PoolState
    config: RouterConfig
    option: PhaseOption | None  # None: no profile row, or the pool fails a request-independent filter
    row: ProfileRow | None
    batch: int  # the batch a new request joins (``cost_model.join_batch``)
    batch_tokens_per_s: float  # the row's throughput at that batch
    capacity: float  # workers x throughput at full batch (``queue_wait``'s divisor)
    per_worker_s: float | None  # $ per worker-second, None without a price
    free_for_one: float  # ``cost_model.free_kv_for_one``


def _view(pool: PoolState, phase: Phase, model: str, profiles: ProfileTable, now: float,
          config: RouterConfig) -> PhaseView:
    profile = None
    if phase in pool.phases and model in pool.models:
        profile = effective_profile(profiles, model, phase, pool.name, pool.variant, now, config.confidence)
    free = pool.free_kv_bytes if pool.worker_free_kv_bytes is None else pool.worker_free_kv_bytes
    if profile is None:
        return PhaseView(pool, config, None, None, 1, 0.0, 0.0, None, free)
    row = profile.row
    ok = (pool.alive and not pool.workers < 1 and not now - pool.last_heartbeat > config.heartbeat_timeout_s
          and row.error_rate < config.max_error_rate)
    workers = pool.workers
    batch = max(1, min(pool.max_batch, pool.in_flight // max(workers, 1) + 1))
    price = pool.price_per_hour
    return PhaseView(
        pool, config, PhaseOption(pool, phase, row, profile.confidence) if ok else None, row, batch,
        row.tokens_per_s(batch), workers * row.tokens_per_s(pool.max_batch),
        None if price is None else price / 3600.0 / max(workers, 1), free,
    )


def phase_views(pools: Iterable[PoolState], profiles: ProfileTable, phase: Phase, model: str, now: float,
                config: RouterConfig) -> list[PhaseView]:
    """The view of each pool (in ``pools`` order) for ``phase`` of ``model`` at ``now``."""
    cache: dict[str, PhaseView] = profiles.memo(("phase_views", phase, model, id(config)), now, dict)
    out = []
    for pool in pools:
        view = cache.get(pool.name)
        if view is None or view.pool is not pool or view.config is not config:
            view = cache[pool.name] = _view(pool, phase, model, profiles, now, config)
        out.append(view)
    return out


def phase_costs(
    request: RequestWork,
    pools: Iterable[PoolState],
    profiles: ProfileTable,
    phase: Phase,
    now: float,
    config: RouterConfig,
    *,
    skip: frozenset[str] = frozenset(),
) -> tuple[list[PhaseCost], list[tuple[str, str]]]:
    """``phase_cost`` of every pool ``phase_options`` keeps for ``phase``, and why the rest failed."""
    costs: list[PhaseCost] = []
    rejected: list[tuple[str, str]] = []
    quick = skip <= _QUICK_SKIPS
    need_quality = required_quality(request, config)
    check_room = "room_now" not in skip
    avoid = request.avoid_pools if "not_avoided" not in skip else frozenset()
    prefill = phase is Phase.PREFILL
    tokens = request.prompt_tokens if prefill else request.max_output_tokens
    kv_tokens = request.prompt_tokens if prefill else request.total_tokens
    for view in phase_views(pools, profiles, phase, request.model, now, config):
        pool, option, row = view.pool, view.option, view.row
        if quick and option is not None and row is not None:
            need = kv_tokens * row.kv_bytes_per_token
            capacity, worker_free = pool.worker_kv_capacity_bytes, pool.worker_free_kv_bytes
            if (row.quality_score >= need_quality
                    and not need > pool.free_kv_bytes and (capacity is None or not need > capacity)
                    and (not check_room or worker_free is None or need <= worker_free)
                    and pool.name not in avoid):
                batch = view.batch
                service_s = tokens * batch / view.batch_tokens_per_s
                queue_tokens, queue_requests = pool.queue_tokens, pool.queue_requests
                if queue_tokens <= 0 and queue_requests <= 0:
                    wait_s = 0.0
                else:
                    queued = queue_tokens if queue_tokens > 0 else queue_requests * tokens
                    wait_s = math.inf if view.capacity <= 0 else queued / view.capacity
                per_worker_s, free = view.per_worker_s, view.free_for_one
                if need <= 0:
                    headroom = 1.0
                elif free <= 0:
                    headroom = 0.0
                else:  # min(1.0, max(0.0, h)) as comparisons: max keeps 0.0 unless h > 0.0, min keeps 1.0 unless < 1.0
                    headroom = 1.0 - need / free
                    headroom = headroom if headroom > 0.0 else 0.0
                    headroom = headroom if headroom < 1.0 else 1.0
                costs.append(PhaseCost(
                    option, wait_s, service_s, None if per_worker_s is None else per_worker_s * service_s / batch,
                    headroom,
                ))
                continue
        profile = None
        if phase in pool.phases and request.model in pool.models:
            profile = effective_profile(profiles, request.model, phase, pool.name, pool.variant, now,
                                        config.confidence)
        reason = first_rejection(FilterInput(request, pool, phase, profile, now, config), skip=skip)
        if reason is None and profile is not None:
            costs.append(phase_cost(request, PhaseOption(pool, phase, profile.row, profile.confidence)))
        elif reason is not None and pool.serves(phase):
            rejected.append((f"{pool.name}/{phase.slug}", reason))
    return costs, rejected
