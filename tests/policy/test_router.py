"""route(): picks, colocate vs disaggregate, exploration, tiers, avoid lists, no placement."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from phaseroute.streams.policy import (
    LinkProfile,
    NoPlacement,
    Phase,
    ProfileSource,
    QualityTier,
    RouterConfig,
    RouterState,
    RoutingDecision,
    ScorerWeights,
    route,
)

GREEDY = RouterConfig(exploration_share=0.0)
PREFILL_ONLY = frozenset({Phase.PREFILL})
DECODE_ONLY = frozenset({Phase.DECODE})


def place(mk, pools, rows, request=None, config=GREEDY, links=(), seed=0, state=None) -> RoutingDecision | NoPlacement:
    return route(
        request or mk.req(),
        pools,
        mk.table(*rows, links=links),
        state or RouterState(),
        config,
        mk.NOW,
        random.Random(seed),
    )


def test_picks_the_measured_faster_pool(mk):
    d = place(mk, [mk.pool("slow"), mk.pool("fast")], [*mk.both("slow", 250.0), *mk.both("fast", 1000.0)])
    assert (d.prefill_pool, d.decode_pool, d.colocated, d.explored) == ("fast", "fast", True, False)
    assert d.estimated_completion == pytest.approx(mk.NOW + d.estimate.total_s)
    assert dict(d.scores)["completion"] == 1.0


def test_measurements_beat_the_cold_start_profile(mk):
    # The profiler thought "a" was fast; thousands of fresh telemetry samples say it is 4x slower than "b".
    rows = [
        *mk.both("a", 2000.0, source=ProfileSource.PROFILER, updated_at=0.0),
        *mk.both("a", 250.0, samples=5000),
        *mk.both("b", 1000.0, source=ProfileSource.PROFILER, updated_at=0.0),
    ]
    assert place(mk, [mk.pool("a"), mk.pool("b")], rows).prefill_pool == "b"


def test_stale_slow_measurement_fades_back_to_the_prior(mk):
    # The slow telemetry of "a" is 2 hours old (half-life 10 min): the router trusts the profiler again.
    rows = [
        *mk.both("a", 2000.0, source=ProfileSource.PROFILER, updated_at=0.0),
        *mk.both("a", 250.0, samples=5000, updated_at=mk.NOW - 7200),
        *mk.both("b", 1000.0, source=ProfileSource.PROFILER, updated_at=0.0),
    ]
    assert place(mk, [mk.pool("a"), mk.pool("b")], rows).prefill_pool == "a"


def disagg_fleet(mk):
    """gpu: fast prefill, weak decode; mem: decode-only pool with 10x the decode throughput."""
    pools = [mk.pool("gpu"), mk.pool("mem", phases=DECODE_ONLY)]
    rows = [
        mk.row("gpu", Phase.PREFILL, 20_000.0),
        mk.row("gpu", Phase.DECODE, 200.0),
        mk.row("mem", Phase.DECODE, 2000.0),
    ]
    return pools, rows


def test_disaggregates_when_a_faster_decode_pool_plus_transfer_wins(mk):
    pools, rows = disagg_fleet(mk)
    fast_link = LinkProfile("gpu", "mem", 1e9, 0.01, 1000, mk.NOW)
    d = place(mk, pools, rows, links=[fast_link])
    assert (d.prefill_pool, d.decode_pool, d.colocated) == ("gpu", "mem", False)
    assert d.estimate.transfer_s == pytest.approx(0.01 + 512 * 1000 / 1e9)
    assert "best colocated alternative: colocated on gpu" in d.reason


def test_colocates_when_the_measured_link_is_too_slow(mk):
    pools, rows = disagg_fleet(mk)
    slow_link = LinkProfile("gpu", "mem", 1e4, 0.01, 1000, mk.NOW)  # 512 KB of KV takes ~51 s
    d = place(mk, pools, rows, links=[slow_link])
    assert (d.prefill_pool, d.decode_pool, d.colocated) == ("gpu", "gpu", True)
    assert "best disaggregated alternative: disaggregated gpu -> mem" in d.reason


def test_disaggregation_can_be_switched_off(mk):
    pools, rows = disagg_fleet(mk)
    d = place(mk, pools, rows, config=RouterConfig(exploration_share=0.0, allow_disaggregation=False))
    assert d.colocated and d.prefill_pool == "gpu"


@pytest.mark.parametrize(("stall_weight", "colocated"), [(0.0, True), (1.0, False)])
def test_prefill_that_would_stall_many_decodes_is_moved_off_the_decode_pool(mk, stall_weight, colocated):
    # Colocating on "dec" is faster for this request, but its prefill stalls 30 in-flight decodes.
    pools = [mk.pool("dec", in_flight=30), mk.pool("pre", phases=PREFILL_ONLY)]
    rows = [
        mk.row("dec", Phase.PREFILL, 10_000.0),
        mk.row("dec", Phase.DECODE, 1000.0),
        mk.row("pre", Phase.PREFILL, 2000.0),
    ]
    config = RouterConfig(exploration_share=0.0, weights=ScorerWeights(stall=stall_weight))
    d = place(mk, pools, rows, config=config)
    assert d.colocated is colocated
    assert d.decode_pool == "dec"


@pytest.mark.parametrize(("cost_weight", "decode_pool"), [(0.0, "gpu"), (1.0, "cheap")])
def test_a_cheaper_decode_pool_wins_when_money_counts(mk, cost_weight, decode_pool):
    pools = [mk.pool("gpu", price=40.0), mk.pool("cheap", phases=DECODE_ONLY, price=2.0)]
    rows = [
        mk.row("gpu", Phase.PREFILL, 20_000.0),
        mk.row("gpu", Phase.DECODE, 1000.0),
        mk.row("cheap", Phase.DECODE, 1000.0),
    ]
    config = RouterConfig(exploration_share=0.0, weights=ScorerWeights(cost=cost_weight))
    assert place(mk, pools, rows, config=config).decode_pool == decode_pool


@pytest.mark.parametrize(("formats", "decode_pool"), [
    (("m|float32|30x3x64|v1", "m|float32|30x3x64|v1"), "cheap"),  # same KV layout: the cheap decode pool wins
    (("m|float32|30x3x64|v1", "m|bfloat16|30x3x64|v1"), "gpu"),  # another dtype: never paired
    (("m|float32|30x3x64|v1", None), "gpu"),  # a pool that does not say: never paired
])
def test_pools_with_different_kv_formats_are_never_paired(mk, formats, decode_pool):
    pools = [mk.pool("gpu", price=40.0, kv_format=formats[0]),
             mk.pool("cheap", phases=DECODE_ONLY, price=2.0, kv_format=formats[1])]
    rows = [mk.row("gpu", Phase.PREFILL, 20_000.0), mk.row("gpu", Phase.DECODE, 1000.0),
            mk.row("cheap", Phase.DECODE, 1000.0)]
    decision = place(mk, pools, rows, config=RouterConfig(exploration_share=0.0, weights=ScorerWeights(cost=1.0)))
    assert decision.decode_pool == decode_pool
    if decode_pool == "gpu":
        assert any(where == "gpu->cheap" and "KV format" in why for where, why in decision.rejected)


def test_quality_tiers(mk):
    pools = [mk.pool("ref"), mk.pool("int8", variant="int8")]
    rows = [*mk.both("ref", 500.0), *mk.both("int8", 1500.0, variant="int8", quality=0.9)]
    exact = place(mk, pools, rows, request=mk.req(tier=QualityTier.EXACT))
    assert exact.prefill_pool == exact.decode_pool == "ref"
    assert any(pool == "int8/prefill" and "quality 0.900 < 0.990" in why for pool, why in exact.rejected)
    approx = place(mk, pools, rows, request=mk.req(tier=QualityTier.APPROXIMATE, tolerance=0.2))
    # 0.9 x 0.9 = 0.81 over both phases on int8 is within a 0.2 tolerance.
    assert approx.prefill_pool == approx.decode_pool == "int8"
    tight = place(mk, pools, rows, request=mk.req(tier=QualityTier.APPROXIMATE, tolerance=0.15))
    # 0.81 on int8 alone is too lossy for 0.15, but one lossy phase (0.9) is not: the quality bound shapes the path.
    assert (tight.prefill_pool, tight.decode_pool) == ("ref", "int8") and tight.estimate.quality == pytest.approx(0.9)
    assert ("int8->int8", "path quality 0.810 < 0.850 required by APPROXIMATE tier") in tight.rejected


def test_exploration_share_is_close_to_configured(mk):
    pools = [mk.pool(n) for n in ("a", "b", "c")]
    rows = [*mk.both("a", 1000.0), *mk.both("b", 500.0), *mk.both("c", 250.0)]
    t = mk.table(*rows)
    config = RouterConfig(exploration_share=0.05)
    rng = random.Random(42)
    n = 4000
    decisions = [route(mk.req(f"r{i}"), pools, t, RouterState(), config, mk.NOW, rng) for i in range(n)]
    explored = [d for d in decisions if d.explored]
    assert abs(len(explored) / n - 0.05) < 0.015  # ~4.4 standard deviations
    used = Counter(p for d in explored for p in {d.prefill_pool, d.decode_pool})
    assert set(used) == {"a", "b", "c"}  # every eligible pool gets measured
    assert all(d.prefill_pool == "a" for d in decisions if not d.explored)


def test_no_placement_lists_why_each_pool_failed(mk):
    pools = [mk.pool("dead", alive=False), mk.pool("other", models=frozenset({"llama"}))]
    d = place(mk, pools, [*mk.both("dead"), *mk.both("other")])
    assert isinstance(d, NoPlacement)
    reasons = dict(d.rejected)
    assert reasons["dead/prefill"] == "alive: pool is not alive"
    assert reasons["other/decode"].startswith("model_loaded: model 'smollm2-135m' not loaded")


def test_avoid_list_moves_the_request_and_is_relaxed_only_when_nothing_else_fits(mk):
    rows = [*mk.both("a", 1000.0), *mk.both("b", 500.0)]
    moved = place(mk, [mk.pool("a"), mk.pool("b")], rows, request=mk.req(avoid=frozenset({"a"})))
    assert (moved.prefill_pool, moved.decode_pool) == ("b", "b")
    alone = place(mk, [mk.pool("a")], rows, request=mk.req(avoid=frozenset({"a"})))
    assert alone.prefill_pool == "a"  # better an avoided pool than no placement
    strict = RouterConfig(exploration_share=0.0, relax_avoid_when_empty=False)
    assert isinstance(
        place(mk, [mk.pool("a")], rows, request=mk.req(avoid=frozenset({"a"})), config=strict), NoPlacement
    )


def test_room_now_steers_to_a_pool_with_room_and_is_relaxed_when_no_pool_has_any(mk):
    """The request's decode needs 640 kB. The fast pool's workers are full now; the slow one has
    room: the request goes where it can start. When no worker anywhere has room, it queues on a
    pool that can hold it once room frees (the faster one), never on one too small to ever hold it."""
    rows = [*mk.both("fast", 1000.0), *mk.both("slow", 500.0), *mk.both("tiny", 4000.0)]
    full_fast = mk.pool("fast", worker_free_kv=100_000, worker_kv_capacity=4_000_000)
    roomy_slow = mk.pool("slow", worker_free_kv=2_000_000, worker_kv_capacity=4_000_000)
    tiny = mk.pool("tiny", worker_free_kv=500_000, worker_kv_capacity=500_000)
    d = place(mk, [full_fast, roomy_slow, tiny], rows)
    assert (d.prefill_pool, d.decode_pool) == ("slow", "slow")
    full_slow = mk.pool("slow", worker_free_kv=0, worker_kv_capacity=4_000_000)
    queued = place(mk, [full_fast, full_slow, tiny], rows)
    assert queued.decode_pool == "fast"
    assert "room_now" in dict(place(mk, [full_fast, full_slow, tiny], rows,
                                    config=RouterConfig(exploration_share=0.0, relax_room_when_empty=False)).rejected)["fast/decode"]
    never = place(mk, [tiny], rows)
    assert isinstance(never, NoPlacement)
    assert "a worker of this pool holds at most 500000" in dict(never.rejected)["tiny/decode"]


def test_a_pool_with_measured_100_percent_errors_gets_nothing_even_from_exploration(mk):
    rows = [*mk.both("good", 100.0), *mk.both("broken", 5000.0, err=1.0)]
    pools = [mk.pool("good"), mk.pool("broken")]
    t = mk.table(*rows)
    config = RouterConfig(exploration_share=0.5)
    rng = random.Random(3)
    used = {
        p
        for i in range(500)
        for d in [route(mk.req(f"r{i}"), pools, t, RouterState(), config, mk.NOW, rng)]
        for p in (d.prefill_pool, d.decode_pool)
    }
    assert used == {"good"}


def test_queue_depth_moves_work_to_the_idle_pool(mk):
    rows = [*mk.both("a", 1000.0), *mk.both("b", 1000.0)]
    d = place(mk, [mk.pool("a", queue_tokens=200_000), mk.pool("b")], rows)
    assert d.prefill_pool == "b" and d.estimate.prefill_wait_s == 0.0


def test_deadline_slack_prefers_the_path_that_meets_it(mk):
    # Same speed; "far" carries a queue. Both scored, and the deadline scorer marks the late path.
    rows = [*mk.both("near", 1000.0), *mk.both("far", 1000.0)]
    pools = [mk.pool("near"), mk.pool("far", queue_tokens=50_000)]
    d = place(mk, pools, rows, request=mk.req(deadline=mk.NOW + 5.0))
    assert d.prefill_pool == "near" and dict(d.scores)["deadline"] > 0.5


def test_route_is_deterministic_for_a_seed(mk):
    pools = [mk.pool("a"), mk.pool("b")]
    rows = [*mk.both("a", 1000.0), *mk.both("b", 900.0)]
    config = RouterConfig(exploration_share=0.3)
    runs = [
        [place(mk, pools, rows, request=mk.req(f"r{i}"), config=config, seed=i).prefill_pool for i in range(50)]
        for _ in range(2)
    ]
    assert runs[0] == runs[1]


def test_pruned_disaggregation_candidates_keep_the_best_path_and_cover_every_pool(mk):
    rng = random.Random(11)
    for trial in range(25):
        names = [f"p{i}" for i in range(7)]
        pools, rows = [], []
        for name in names:
            phases = rng.choice([mk.BOTH, PREFILL_ONLY, DECODE_ONLY])
            pools.append(mk.pool(name, phases=phases, in_flight=rng.randrange(20), queue_tokens=rng.randrange(20_000)))
            rows += [
                mk.row(name, Phase.PREFILL, rng.uniform(2000, 20_000)),
                mk.row(name, Phase.DECODE, rng.uniform(100, 2000)),
            ]
        full = place(mk, pools, rows, config=RouterConfig(exploration_share=0.0, disaggregation_candidates=0))
        pruned_config = RouterConfig(exploration_share=0.0, disaggregation_candidates=2)
        pruned = place(mk, pools, rows, config=pruned_config)
        if isinstance(full, NoPlacement):
            assert isinstance(pruned, NoPlacement)
            continue
        assert (pruned.prefill_pool, pruned.decode_pool) == (full.prefill_pool, full.decode_pool), trial
        assert pruned.eligible_prefill == full.eligible_prefill and pruned.eligible_decode == full.eligible_decode
