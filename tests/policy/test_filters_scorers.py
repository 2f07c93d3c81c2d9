"""Each router filter and scorer on its own (table-driven), and the cost model's arithmetic."""

from __future__ import annotations

import pytest

from phaseroute.streams.policy import (
    EffectiveProfile,
    LinkProfile,
    PathEstimate,
    Phase,
    PhaseOption,
    QualityTier,
    RouterConfig,
    estimate_path,
    filters,
    join_batch,
    scorers,
)
from phaseroute.streams.policy.cost_model import phase_cost

CFG = RouterConfig()


def run_filter(mk, name, *, pool=None, request=None, phase=Phase.DECODE, profile_row="default", now=None):
    pool = pool or mk.pool("p")
    if profile_row == "default":
        profile_row = mk.row("p", phase)
    profile = None if profile_row is None else EffectiveProfile(profile_row, 1.0, 1.0)
    request, now = request or mk.req(), mk.NOW if now is None else now
    if name in dict(filters.POOL_FILTERS):
        return dict(filters.POOL_FILTERS)[name](filters.PoolInput(pool, phase, request.model, profile, now, CFG))
    others = frozenset(filters.REQUEST_FILTERS) - {name}
    reason = filters.request_rejection(request, pool, profile.row, phase, CFG, skip=others)
    return None if reason is None else reason.removeprefix(f"{name}: ")


@pytest.mark.parametrize(
    ("name", "setup", "needle"),
    [
        ("alive", {}, None),
        ("alive", {"pool": dict(alive=False)}, "not alive"),
        ("alive", {"pool": dict(workers=0)}, "pool has no workers"),
        ("alive", {"pool": dict(heartbeat=10_000.0 - 11)}, "no heartbeat for 11.0 s (timeout 10.0 s)"),
        (
            "serves_phase",
            {"pool": dict(phases=frozenset({Phase.PREFILL}))},
            "does not serve decode (serves ['prefill'])",
        ),
        (
            "model_loaded",
            {"pool": dict(models=frozenset({"other"}))},
            "model 'smollm2-135m' not loaded (loaded: ['other'])",
        ),
        ("has_profile", {"row": None}, "no profile row for (smollm2-135m, decode, variant 'fp32')"),
        ("healthy", {"row": dict(err=0.49)}, None),
        ("healthy", {"row": dict(err=0.5)}, "measured error rate 0.50 >= max 0.50"),
        ("quality", {"row": dict(quality=0.99)}, None),
        ("quality", {"row": dict(quality=0.95)}, "quality 0.950 < 0.990 required by EXACT tier"),
        ("quality", {"row": dict(quality=0.95), "req": dict(tier=QualityTier.APPROXIMATE, tolerance=0.1)}, None),
        (
            "quality",
            {"row": dict(quality=0.85), "req": dict(tier=QualityTier.APPROXIMATE, tolerance=0.1)},
            "quality 0.850 < 0.900 required by APPROXIMATE tier",
        ),
        # decode holds prompt + output KV: (512 + 128) x 1000 bytes
        ("memory", {"pool": dict(free_kv=640_000)}, None),
        ("memory", {"pool": dict(free_kv=639_999)}, "needs 640000 KV bytes, 639999 free"),
        # ten workers of 100 kB each: 1 MB in all, but no worker can ever hold 640 kB
        (
            "memory",
            {"pool": dict(free_kv=1_000_000, worker_kv_capacity=100_000)},
            "needs 640000 KV bytes on one worker, a worker of this pool holds at most 100000",
        ),
        ("memory", {"pool": dict(free_kv=1_000_000, worker_kv_capacity=640_000)}, None),
        # no worker has room right now, but one could once its sequences finish: it queues there
        ("memory", {"pool": dict(free_kv=1_000_000, worker_free_kv=100_000, worker_kv_capacity=700_000)}, None),
        ("not_avoided", {"req": dict(avoid=frozenset({"p"}))}, "avoid list"),
        ("not_avoided", {"req": dict(avoid=frozenset({"q"}))}, None),
    ],
)
def test_pool_filters(mk, name, setup, needle):
    pool = mk.pool("p", **setup.get("pool", {}))
    request = mk.req(**setup.get("req", {}))
    row = None if setup.get("row", {}) is None else mk.row("p", Phase.DECODE, **setup.get("row", {}))
    reason = run_filter(mk, name, pool=pool, request=request, profile_row=row)
    if needle is None:
        assert reason is None
    else:
        assert needle in reason


def test_prefill_memory_needs_only_the_prompt(mk):
    assert run_filter(mk, "memory", pool=mk.pool("p", free_kv=512_000), phase=Phase.PREFILL) is None


def test_headroom_is_measured_on_the_roomiest_worker_when_known(mk):
    """The memory scorer's headroom is 1 - need / free on one worker, not on the pool's sum."""
    row = mk.row("p", Phase.DECODE)
    req = mk.req()  # decode needs 640 kB
    summed = mk.pool("p", free_kv=6_400_000)
    per_worker = mk.pool("p", free_kv=6_400_000, worker_free_kv=1_280_000)
    assert phase_cost(req, PhaseOption(summed, Phase.DECODE, row, 1.0)).headroom == pytest.approx(0.9)
    assert phase_cost(req, PhaseOption(per_worker, Phase.DECODE, row, 1.0)).headroom == pytest.approx(0.5)


def test_path_filter_uses_quality_over_both_phases(mk):
    pre = PhaseOption(mk.pool("a"), Phase.PREFILL, mk.row("a", Phase.PREFILL, quality=0.995), 1.0)
    dec = PhaseOption(mk.pool("b"), Phase.DECODE, mk.row("b", Phase.DECODE, quality=0.99), 1.0)
    est = estimate_path(mk.req(), pre, dec, LinkProfile("a", "b", 1e9, 0.0, 1, 0.0))
    assert est.quality == pytest.approx(0.98505)
    assert "path quality 0.985 < 0.990" in filters.path_filter(mk.req(), est, CFG)
    assert filters.path_filter(mk.req(tier=QualityTier.APPROXIMATE, tolerance=0.02), est, CFG) is None


def estimate(**kw) -> PathEstimate:
    base = dict(
        prefill_pool="a",
        decode_pool="a",
        prefill_wait_s=0.0,
        prefill_s=1.0,
        transfer_s=0.0,
        decode_wait_s=0.0,
        decode_s=9.0,
        kv_bytes=0.0,
        cost=None,
        quality=1.0,
        success_prob=1.0,
        memory_headroom=1.0,
        stall_s=0.0,
    )
    base.update(kw)
    return PathEstimate(**base)


@pytest.mark.parametrize(
    ("name", "est", "best_total", "best_cost", "deadline", "expected"),
    [
        ("completion", {}, 10.0, None, None, 1.0),
        ("completion", {"decode_s": 39.0}, 10.0, None, None, 0.25),
        ("completion", {"decode_wait_s": float("inf")}, 10.0, None, None, 0.0),
        ("cost", {}, 10.0, None, None, 1.0),  # nobody priced: neutral
        ("cost", {"cost": 2.0}, 10.0, 1.0, None, 0.5),
        ("cost", {"cost": None}, 10.0, 1.0, None, 0.5),
        ("memory", {"memory_headroom": 0.3}, 10.0, None, None, 0.3),
        ("failure", {"success_prob": 0.81}, 10.0, None, None, 0.81),
        ("deadline", {}, 10.0, None, None, 1.0),  # no deadline
        ("deadline", {}, 10.0, None, 10_000.0 + 10 + 60, 1.0),  # slack = ref
        ("deadline", {}, 10.0, None, 10_000.0 + 10, 0.5),  # slack 0
        ("deadline", {}, 10.0, None, 10_000.0 + 10 - 30, 0.25),
        ("deadline", {}, 10.0, None, 10_000.0 - 1000, 0.0),
        ("stall", {}, 10.0, None, None, 1.0),
        ("stall", {"stall_s": 30.0}, 10.0, None, None, 0.5),
    ],
)
def test_scorers(mk, name, est, best_total, best_cost, deadline, expected):
    x = scorers.ScoreInput(
        [estimate(**est)], scorers.FieldStats(best_total, best_cost), mk.req(deadline=deadline), mk.NOW, CFG
    )
    _, parts = scorers.score_path(x)
    value = dict(parts)[name]
    assert 0.0 <= value <= 1.0
    assert value == pytest.approx(expected)


def test_composite_is_the_weighted_mean(mk):
    x = scorers.ScoreInput(
        [estimate(decode_s=19.0, success_prob=0.5)], scorers.FieldStats(10.0, None), mk.req(), mk.NOW, CFG
    )
    total, parts = scorers.score_path(x)
    w = CFG.weights
    expected = (w.completion * 0.5 + w.cost + w.memory + w.failure * 0.5 + w.deadline + w.stall) / (
        w.completion + w.cost + w.memory + w.failure + w.deadline + w.stall
    )
    assert total == pytest.approx(expected)
    assert dict(parts)["completion"] == pytest.approx(0.5)


def test_scoring_all_paths_at_once_scores_each_as_if_alone(mk):
    """Column-at-a-time scoring gives every path the score it gets on its own in the same field."""
    paths = [estimate(decode_s=19.0), estimate(cost=2.0, success_prob=0.7), estimate(stall_s=12.0, memory_headroom=0.2)]
    field = scorers.FieldStats(10.0, 1.0)
    req = mk.req(deadline=mk.NOW + 25.0)
    totals, columns = scorers.score_paths(scorers.ScoreInput(paths, field, req, mk.NOW, CFG))
    for i, e in enumerate(paths):
        alone, parts = scorers.score_path(scorers.ScoreInput([e], field, req, mk.NOW, CFG))
        assert totals[i] == pytest.approx(alone)
        assert dict(scorers.parts_of(columns, i)) == pytest.approx(dict(parts))
    with pytest.raises(ValueError, match="one estimate, got 3"):
        scorers.score_path(scorers.ScoreInput(paths, field, req, mk.NOW, CFG))


@pytest.mark.parametrize(
    ("in_flight", "workers", "max_batch", "batch"), [(0, 1, 32, 1), (7, 1, 32, 8), (100, 1, 32, 32), (9, 2, 32, 5)]
)
def test_join_batch(mk, in_flight, workers, max_batch, batch):
    assert join_batch(mk.pool("p", in_flight=in_flight, workers=workers, max_batch=max_batch)) == batch


def test_estimate_path_colocated_vs_disaggregated(mk):
    req = mk.req(prompt=1000, out=100)
    a = mk.pool("a", in_flight=7, queue_tokens=20_000)
    b = mk.pool("b", queue_tokens=0, price=3.6)
    pre = PhaseOption(a, Phase.PREFILL, mk.row("a", Phase.PREFILL, 10_000.0), 1.0)
    dec_a = PhaseOption(a, Phase.DECODE, mk.row("a", Phase.DECODE, 800.0), 1.0)
    dec_b = PhaseOption(b, Phase.DECODE, mk.row("b", Phase.DECODE, 800.0, err=0.1), 1.0)
    colo = estimate_path(req, pre, dec_a, None)
    # batch 8 on a: prefill 1000 x 8 / 5000 = 1.6 s, decode 100 x 8 / 400 = 2 s; queue 20000 / 10000 = 2 s
    assert (colo.prefill_wait_s, colo.prefill_s, colo.decode_s, colo.transfer_s) == pytest.approx((2.0, 1.6, 2.0, 0.0))
    assert colo.stall_s == pytest.approx(1.6 * 7) and colo.cost is None and colo.colocated
    link = LinkProfile("a", "b", 1e6, 0.5, 10, mk.NOW)
    dis = estimate_path(req, pre, dec_b, link)
    # batch 1 on b: decode 100 / 100 = 1 s; KV 1000 x 1000 bytes over 1 MB/s + 0.5 s
    assert (dis.decode_s, dis.transfer_s, dis.kv_bytes) == pytest.approx((1.0, 1.5, 1e6))
    assert dis.success_prob == pytest.approx(0.9) and not dis.colocated
    assert dis.cost is None  # a carries no price
    assert dis.total_s == pytest.approx(2.0 + 1.6 + 1.5 + 0.0 + 1.0)


def test_queue_wait_counts_requests_when_tokens_unknown(mk):
    r, req = mk.row("p", Phase.DECODE, 1000.0), mk.req(out=100)

    def wait(pool):
        return phase_cost(req, PhaseOption(pool, Phase.DECODE, r, 1.0)).wait_s

    assert wait(mk.pool("p", queue_requests=10)) == pytest.approx(1.0)
    assert wait(mk.pool("p", queue_requests=10, workers=2)) == pytest.approx(0.5)
    assert wait(mk.pool("p")) == 0.0
