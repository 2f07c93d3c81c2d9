"""Anti-herding: bounded share moves per refresh, realized traffic following the targets."""

from __future__ import annotations

import itertools
import random

import pytest

from phaseroute.streams.policy import Phase, RouterConfig, RouterState, route

CONFIG = RouterConfig(exploration_share=0.0, max_share_step=0.1)


def test_first_refresh_starts_even_and_moves_at_most_one_step(mk):
    state = RouterState()
    t = mk.table(*mk.both("a", 900.0), *mk.both("b", 100.0))
    (dec, _prefill) = state.refresh([mk.pool("a"), mk.pool("b")], t, CONFIG, mk.NOW)
    assert dec.phase is Phase.DECODE and dec.desired == pytest.approx({"a": 0.9, "b": 0.1})
    assert dec.before == {"a": 0.5, "b": 0.5}
    assert dec.after == pytest.approx({"a": 0.6, "b": 0.4}) and dec.largest_move == pytest.approx(0.1)


def test_a_refresh_that_flips_the_best_pool_moves_shares_by_at_most_the_bound(mk):
    pools = [mk.pool("a"), mk.pool("b"), mk.pool("c")]
    a_best = mk.table(*mk.both("a", 1000.0), *mk.both("b", 100.0), *mk.both("c", 100.0))
    b_best = mk.table(*mk.both("a", 100.0), *mk.both("b", 1000.0), *mk.both("c", 100.0))
    state = RouterState()
    for _ in range(20):  # settle on "a"
        state.refresh(pools, a_best, CONFIG, mk.NOW)
    settled = state.targets(mk.MODEL, Phase.DECODE)
    assert settled["a"] == pytest.approx(1000 / 1200)
    history = [settled]
    for i in range(20):  # "b" now looks best
        updates = state.refresh(pools, b_best, CONFIG, mk.NOW + i)
        assert all(u.largest_move <= CONFIG.max_share_step + 1e-12 for u in updates)
        history.append(state.targets(mk.MODEL, Phase.DECODE))
    b_shares = [h["b"] for h in history]
    a_shares = [h["a"] for h in history]
    assert b_shares == sorted(b_shares) and a_shares == sorted(a_shares, reverse=True)  # no overshoot, no oscillation
    assert b_shares[1] - b_shares[0] <= 0.1 + 1e-12
    assert b_shares[-1] == pytest.approx(1000 / 1200)
    assert all(sum(h.values()) == pytest.approx(1.0) for h in history)


def test_a_new_pool_ramps_up_instead_of_taking_everything(mk):
    state = RouterState()
    t = mk.table(*mk.both("a", 100.0), *mk.both("b", 100.0))
    state.refresh([mk.pool("a")], t, CONFIG, mk.NOW)
    assert state.targets(mk.MODEL, Phase.DECODE) == {"a": 1.0}
    state.refresh([mk.pool("a"), mk.pool("b")], t, CONFIG, mk.NOW)
    assert state.targets(mk.MODEL, Phase.DECODE) == pytest.approx({"a": 0.9, "b": 0.1})


def test_realized_traffic_follows_the_target_split(mk):
    # "a" is faster, so every request would go there; the deficit counters hold it to its target share.
    pools = [mk.pool("a"), mk.pool("b")]
    t = mk.table(*mk.both("a", 600.0), *mk.both("b", 400.0))
    state = RouterState()
    for _ in range(10):
        state.refresh(pools, t, CONFIG, mk.NOW)
    rng = random.Random(0)
    decode_pools = []
    for i in range(1000):
        request = mk.req(f"r{i}")
        d = route(request, pools, t, state, CONFIG, mk.NOW + i * 0.01, rng)
        state.record(d, request, mk.NOW + i * 0.01, CONFIG)
        decode_pools.append(d.decode_pool)
    # "a" runs about share_slack above its target share, never more.
    assert decode_pools[500:].count("a") / 500 == pytest.approx(0.6 + CONFIG.share_slack, abs=0.015)
    snap = state.snapshot()[f"{mk.MODEL}/decode"]
    assert snap["target"] == pytest.approx({"a": 0.6, "b": 0.4})
    assert set(snap["credit"]) == {"a", "b"} and snap["realized"]["a"] == pytest.approx(0.62, abs=0.015)


def test_equal_pools_alternate_instead_of_herding(mk):
    pools = [mk.pool("a"), mk.pool("b")]
    t = mk.table(*mk.both("a", 500.0), *mk.both("b", 500.0))
    state = RouterState()
    state.refresh(pools, t, CONFIG, mk.NOW)
    rng = random.Random(0)
    picks = []
    for i in range(40):
        request = mk.req(f"r{i}")
        d = route(request, pools, t, state, CONFIG, mk.NOW, rng)
        state.record(d, request, mk.NOW, CONFIG)
        picks.append(d.decode_pool)
    assert picks.count("a") == 20
    assert all(x != y for x, y in itertools.pairwise(picks))


def test_without_a_refresh_the_router_is_purely_score_driven(mk):
    pools = [mk.pool("a"), mk.pool("b")]
    t = mk.table(*mk.both("a", 600.0), *mk.both("b", 400.0))
    state = RouterState()
    rng = random.Random(0)
    for i in range(50):
        request = mk.req(f"r{i}")
        d = route(request, pools, t, state, CONFIG, mk.NOW, rng)
        state.record(d, request, mk.NOW, CONFIG)
        assert d.prefill_pool == "a"


def test_failing_pool_gets_no_target_share(mk):
    state = RouterState()
    t = mk.table(*mk.both("a", 100.0), *mk.both("bad", 10_000.0, err=0.9))
    state.refresh([mk.pool("a"), mk.pool("bad")], t, CONFIG, mk.NOW)
    assert state.targets(mk.MODEL, Phase.PREFILL) == {"a": 1.0}
