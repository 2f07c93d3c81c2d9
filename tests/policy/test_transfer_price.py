"""The price of moving KV between pools: in a disaggregated path's dollars, and so in the router's choice."""

from __future__ import annotations

import random

import pytest

from phaseroute.streams.policy import LinkProfile, Phase, RouterConfig, RouterState, ScorerWeights, route
from phaseroute.streams.policy.cost_model import PhaseOption, combine, phase_cost, transfer_dollars

DECODE_ONLY = frozenset({Phase.DECODE})


def _fleet(mk):
    """gpu ($40/h) prefills fast and decodes; cheap ($2/h) decodes as fast: disaggregating to
    cheap saves decode dollars and moves the prompt's KV (512 tokens x 1,000 B = 512 kB)."""
    pools = [mk.pool("gpu", price=40.0), mk.pool("cheap", phases=DECODE_ONLY, price=2.0)]
    rows = [mk.row("gpu", Phase.PREFILL, 20_000.0), mk.row("gpu", Phase.DECODE, 1000.0),
            mk.row("cheap", Phase.DECODE, 1000.0)]
    link = LinkProfile("gpu", "cheap", 1e9, 0.001, 1000, mk.NOW)
    return pools, rows, link


def test_a_disaggregated_path_pays_for_the_kv_it_moves_a_colocated_one_does_not(mk):
    pools, rows, link = _fleet(mk)
    request = mk.req()
    gpu_pre = phase_cost(request, PhaseOption(pools[0], Phase.PREFILL, rows[0], 1.0))
    gpu_dec = phase_cost(request, PhaseOption(pools[0], Phase.DECODE, rows[1], 1.0))
    cheap_dec = phase_cost(request, PhaseOption(pools[1], Phase.DECODE, rows[2], 1.0))
    free = combine(request, gpu_pre, cheap_dec, link)
    priced = combine(request, gpu_pre, cheap_dec, link, transfer_usd_per_gb=0.05)
    assert free.kv_bytes == priced.kv_bytes == 512 * 1000
    assert priced.cost - free.cost == pytest.approx(512e3 / 1e9 * 0.05)
    assert transfer_dollars(512e3, 0.05) == pytest.approx(2.56e-5)
    colocated = combine(request, gpu_pre, gpu_dec, None, transfer_usd_per_gb=0.05)
    assert colocated.kv_bytes == 0.0
    assert colocated.cost == combine(request, gpu_pre, gpu_dec, None).cost


@pytest.mark.parametrize(("usd_per_gb", "colocated"), [(0.0, False), (1.0, False), (50.0, True)])
def test_the_router_colocates_once_moving_the_kv_costs_more_than_disaggregating_saves(mk, usd_per_gb, colocated):
    # Decoding the 128 tokens takes ~1.02 s either way: $0.0113 on gpu, $0.0006 on cheap. Moving
    # 512 kB costs $0.0005 at $1/GB (disaggregating still pays) and $0.026 at $50/GB (it does not).
    pools, rows, link = _fleet(mk)
    config = RouterConfig(exploration_share=0.0, weights=ScorerWeights(cost=1.0), transfer_usd_per_gb=usd_per_gb)
    d = route(mk.req(), pools, mk.table(*rows, links=[link]), RouterState(), config, mk.NOW, random.Random(0))
    assert d.colocated is colocated, d.reason
    assert d.decode_pool == ("gpu" if colocated else "cheap")


@pytest.mark.parametrize("bad", [-0.01, float("inf"), float("nan")])
def test_a_bad_transfer_price_is_refused_with_its_value(bad):
    with pytest.raises(ValueError, match="transfer_usd_per_gb"):
        RouterConfig(transfer_usd_per_gb=bad)


class _SharesOver(RouterState):
    """A router state in which the named pools have run ahead of their traffic share, per phase."""

    def __init__(self, over: dict[Phase, frozenset[str]]) -> None:
        super().__init__()
        self.over = over

    def over_budget(self, model, phase, config):
        return self.over.get(phase, frozenset())


def _two_pools(mk):
    """a and b colocate alike; b -> a moves the prompt's KV (512 kB) over a fast link."""
    pools = [mk.pool("a", price=4.0), mk.pool("b", price=4.0, queue_tokens=2_000)]
    rows = [*mk.both("a", 1000.0), *mk.both("b", 1000.0)]
    links = [LinkProfile(s, d, 1e9, 0.001, 1000, mk.NOW) for s, d in (("a", "b"), ("b", "a"))]
    return pools, mk.table(*rows, links=links)


@pytest.mark.parametrize(("usd_per_gb", "walk_share", "walks_to_transfer"),
                         [(0.0, 0.1, True), (50.0, 0.1, False), (50.0, 1e6, True)])
def test_keeping_pools_within_their_share_never_buys_a_transfer_dearer_than_the_work(mk, usd_per_gb, walk_share,
                                                                                     walks_to_transfer):
    # The best path is colocated on a. a has taken more than its prefill share and b more than its
    # decode share, so the only path within both budgets is b -> a, which moves the KV: free, the
    # picker walks there; at $50/GB ($0.026, far over a tenth of the path's dollars) it stays.
    pools, table = _two_pools(mk)
    state = _SharesOver({Phase.PREFILL: frozenset({"a"}), Phase.DECODE: frozenset({"b"})})
    config = RouterConfig(exploration_share=0.0, transfer_usd_per_gb=usd_per_gb, walk_transfer_share=walk_share)
    d = route(mk.req(), pools, table, state, config, mk.NOW, random.Random(0))
    assert (d.prefill_pool, d.decode_pool) == (("b", "a") if walks_to_transfer else ("a", "a")), d.reason
    assert (d.passed_over > 0) is walks_to_transfer


@pytest.mark.parametrize(("walk_share", "explores_cheap"), [(0.1, False), (1e6, True)])
def test_exploration_skips_a_pool_it_could_reach_only_through_a_priced_transfer(mk, walk_share, explores_cheap):
    # Every decision explores. cheap only decodes, so reaching it moves the KV: at $50/GB the
    # picker explores gpu only (its colocated path) unless the walk may spend without bound.
    pools, rows, link = _fleet(mk)
    config = RouterConfig(exploration_share=1.0, transfer_usd_per_gb=50.0, walk_transfer_share=walk_share)
    table, rng = mk.table(*rows, links=[link]), random.Random(5)
    decisions = [route(mk.req(f"r{i}"), pools, table, RouterState(), config, mk.NOW, rng) for i in range(200)]
    on_cheap = sum(d.decode_pool == "cheap" for d in decisions)
    assert all(d.colocated or d.decode_pool == "cheap" for d in decisions)
    if explores_cheap:
        assert 60 <= on_cheap <= 140 and all(d.explored for d in decisions if d.decode_pool == "cheap")
    else:
        assert on_cheap == 0


@pytest.mark.parametrize("bad", [-0.5, float("inf"), float("nan")])
def test_a_bad_walk_transfer_share_is_refused_with_its_value(bad):
    with pytest.raises(ValueError, match="walk_transfer_share"):
        RouterConfig(walk_transfer_share=bad)
