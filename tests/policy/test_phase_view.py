"""The router's fast paths give exactly what the plain functions give: ``phase_view.phase_costs``
(views kept per pool state) against every filter and ``cost_model.phase_cost`` run afresh, and
the router's pair list against ``paths.candidate_pairs`` (same pools, same order, same floats,
same rejection reasons)."""

from __future__ import annotations

import pytest

from phaseroute.streams.policy import Phase, QualityTier, RouterConfig
from phaseroute.streams.policy.confidence import effective_profile
from phaseroute.streams.policy.cost_model import PhaseOption, phase_cost
from phaseroute.streams.policy.filters import PoolInput, pool_rejection, request_rejection
from phaseroute.streams.policy.paths import candidate_pairs
from phaseroute.streams.policy.phase_view import phase_costs
from phaseroute.streams.policy.router import _pairs


def _fleet(mk):
    """Pools that pass, and pools that fail each filter in turn (one reason each)."""
    pools = [
        mk.pool("ok", in_flight=5, queue_tokens=3000, price=4.0, worker_free_kv=5e6, worker_kv_capacity=1e9),
        mk.pool("queued", workers=2, queue_requests=7, in_flight=70, price=2.5),
        mk.pool("dead", alive=False),
        mk.pool("silent", heartbeat=mk.NOW - 60),
        mk.pool("prefill-only", phases=frozenset({Phase.PREFILL}), max_batch=8, in_flight=3),
        mk.pool("other-model", models=frozenset({"other"})),
        mk.pool("unprofiled"),
        mk.pool("flaky"),
        mk.pool("lossy"),
        mk.pool("small", free_kv=1e5),
        mk.pool("tiny-worker", worker_kv_capacity=2e5),
        mk.pool("full-now", worker_free_kv=1e5, price=1.0),
        mk.pool("avoided", in_flight=40),
        mk.pool("no-workers", workers=0),
    ]
    rows = []
    for p in pools:
        if p.name == "unprofiled":
            continue
        rows += mk.both(p.name, 2000.0 if p.name != "queued" else 500.0,
                        err=0.6 if p.name == "flaky" else 0.01,
                        quality=0.9 if p.name == "lossy" else 1.0)
    return pools, mk.table(*rows)


def phase_options(request, pools, table, phase, now, config, *, skip=frozenset()):
    """The plain reference: each pool through the filters afresh, nothing kept between calls."""
    kept, rejected = [], []
    for pool in pools:
        profile = None
        if pool.serves(phase) and request.model in pool.models:
            profile = effective_profile(table, request.model, phase, pool.name, pool.variant, now, config.confidence)
        reason = pool_rejection(PoolInput(pool, phase, request.model, profile, now, config))
        if reason is None:
            reason = request_rejection(request, pool, profile.row, phase, config, skip=skip)
        if reason is None:
            kept.append(PhaseOption(pool, phase, profile.row, profile.confidence))
        elif pool.serves(phase):
            rejected.append((f"{pool.name}/{phase.slug}", reason))
    return kept, rejected


def test_phase_costs_refuse_to_skip_a_request_independent_filter(mk):
    pools, table = _fleet(mk)
    with pytest.raises(ValueError, match="alive"):
        phase_costs(mk.req(), pools, table, Phase.PREFILL, mk.NOW, RouterConfig(), skip=frozenset({"alive"}))


REQUESTS = [
    {},
    {"prompt": 300, "out": 40, "avoid": frozenset({"avoided", "ok"})},
    {"prompt": 4000, "out": 900, "tier": QualityTier.APPROXIMATE, "tolerance": 0.2},
]
SKIPS = [frozenset(), frozenset({"room_now"}), frozenset({"room_now", "not_avoided"}), frozenset({"memory"})]


@pytest.mark.parametrize("phase", [Phase.PREFILL, Phase.DECODE])
@pytest.mark.parametrize("skip", SKIPS)
@pytest.mark.parametrize("request_kw", REQUESTS)
def test_phase_costs_equal_phase_options_then_phase_cost(mk, phase, skip, request_kw):
    pools, table = _fleet(mk)
    request, config = mk.req(**request_kw), RouterConfig()
    options, rejected = phase_options(request, pools, table, phase, mk.NOW, config, skip=skip)
    expected = [phase_cost(request, o) for o in options]
    for _ in range(2):  # the second call reads the views kept for this ``now``
        costs, fast_rejected = phase_costs(request, pools, table, phase, mk.NOW, config, skip=skip)
        assert costs == expected
        assert fast_rejected == rejected
    assert expected and rejected  # the fleet exercises both sides


def test_a_changed_pool_state_gets_a_new_view(mk):
    pools, table = _fleet(mk)
    request, config = mk.req(), RouterConfig()
    before, _ = phase_costs(request, pools, table, Phase.PREFILL, mk.NOW, config)
    busier = [mk.pool("ok", in_flight=200, queue_tokens=3000, price=4.0, worker_free_kv=5e6,
                      worker_kv_capacity=1e9), *pools[1:]]
    after, _ = phase_costs(request, busier, table, Phase.PREFILL, mk.NOW, config)
    options, _ = phase_options(request, busier, table, Phase.PREFILL, mk.NOW, config)
    assert after == [phase_cost(request, o) for o in options]
    assert after[0].service_s > before[0].service_s  # a bigger batch: the request's share is slower


@pytest.mark.parametrize("config", [RouterConfig(), RouterConfig(disaggregation_candidates=0),
                                    RouterConfig(disaggregation_candidates=1),
                                    RouterConfig(allow_disaggregation=False)])
def test_router_pairs_follow_candidate_pairs(mk, config):
    pools, table = _fleet(mk)
    request = mk.req()
    pre, _ = phase_costs(request, pools, table, Phase.PREFILL, mk.NOW, config)
    dec, _ = phase_costs(request, pools, table, Phase.DECODE, mk.NOW, config)
    expected = [(p.option.pool.name, d.option.pool.name) for p, d in candidate_pairs(pre, dec, config)]
    got = [(p[0], d[0]) for p, d in _pairs(pre, dec, request.prompt_tokens, config)]
    assert got == expected
    assert len(expected) > 1
