"""One pool for one phase as the router sees it at one time, and each request's cost there.

The router filters and costs every pool for every request (``filters.pool_rejection`` and
``filters.request_rejection``, then ``cost_model.phase_cost``). Much of that does not depend
on the request: the pool's effective profile row, whether it is alive, fresh, healthy and
serves the phase and model, the batch a new request joins and the throughput there, the
pool's capacity and price per worker-second, the KV memory one request can use. A
:class:`PhaseView` holds those for one (pool state, phase, model, router config) at the
profile table's ``now`` (kept with the table's other values derived at ``now``,
``ProfileTable.memo``), so the requests routed in one tick share it until the pool's state
changes (a dispatch there gives it a new ``PoolState``: the view is rebuilt for it).

The view keeps the verdict of the request-independent filters (``filters.pool_rejection``)
and the request-independent inputs of the cost (``cost_model.cost_inputs``); ``phase_costs``
then runs only the request's own filters (``filters.request_rejection``) and arithmetic
(``cost_model.cost_from``, which ``cost_model.phase_cost`` is made of), so it gives exactly
what every filter then ``phase_cost`` give for each pool, computed afresh.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from .confidence import effective_profile
from .cost_model import CostInputs, PhaseCost, PhaseOption, cost_from, cost_inputs
from .filters import POOL_FILTERS, PoolInput, pool_rejection, request_rejection
from .router_config import RouterConfig
from .types import Phase, PoolState, ProfileTable, RequestWork

_POOL_FILTER_NAMES = frozenset(name for name, _ in POOL_FILTERS)


class PhaseView(NamedTuple):
    """What does not depend on the request, for one pool and phase (see the module docstring)."""

    pool: PoolState
    config: RouterConfig
    rejection: str | None  # ``filters.pool_rejection``: why the pool fails a request-independent filter
    option: PhaseOption | None  # None when ``rejection`` is not None
    inputs: CostInputs | None  # ``cost_model.cost_inputs`` of the option's pool and row


def _view(pool: PoolState, phase: Phase, model: str, profiles: ProfileTable, now: float,
          config: RouterConfig) -> PhaseView:
    profile = None
    if pool.serves(phase) and model in pool.models:
        profile = effective_profile(profiles, model, phase, pool.name, pool.variant, now, config.confidence)
    rejection = pool_rejection(PoolInput(pool, phase, model, profile, now, config))
    if rejection is not None or profile is None:
        return PhaseView(pool, config, rejection, None, None)
    option = PhaseOption(pool, phase, profile.row, profile.confidence)
    return PhaseView(pool, config, None, option, cost_inputs(pool, profile.row))


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
    """``phase_cost`` of every pool that passes every filter for ``phase``, and why the rest
    failed (those that serve the phase), in ``pools`` order.
    ``skip`` may name request filters only (``filters.REQUEST_FILTERS``): the views keep the
    request-independent filters' verdicts whole."""
    pool_level = skip & _POOL_FILTER_NAMES
    if pool_level:
        raise ValueError(f"phase_costs: cannot skip request-independent filters {sorted(pool_level)}")
    costs: list[PhaseCost] = []
    rejected: list[tuple[str, str]] = []
    for view in phase_views(pools, profiles, phase, request.model, now, config):
        pool, option, reason = view.pool, view.option, view.rejection
        if option is not None and view.inputs is not None:
            reason = request_rejection(request, pool, option.row, phase, config, skip=skip)
            if reason is None:
                costs.append(cost_from(request, option, view.inputs))
                continue
        if reason is not None and pool.serves(phase):
            rejected.append((f"{pool.name}/{phase.slug}", reason))
    return costs, rejected
