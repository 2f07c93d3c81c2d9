"""The LP (fluid) bound on tiny instances solved by hand, and its validity against the simulator."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from phaseroute.schemas.enums import Phase
from phaseroute.sim.bound import JobWork, LPPool, deadline_bound, max_throughput, solve
from phaseroute.sim.fleet import FleetEvent, parse_fleet, with_events
from phaseroute.sim.perfmodel import InstancePerf
from phaseroute.sim.runner import prepare, run_policy


def perf(kv_per_token: float = 0.0) -> InstancePerf:
    """1 GFLOP per token at 1 TFLOP/s: 1 ms per prompt or output token; no memory term."""
    return InstancePerf("X", "m", 1, flops=1e12, flops_decode=1e12, bandwidth=1e12, weight_bytes=0.0,
                        kv_per_token=kv_per_token, kv_capacity=1e12, two_p=1e9, dec_attn=0.0, pre_attn=0.0,
                        overhead=0.0, max_batch=1)


def jobs(prompt, output, release, deadline) -> JobWork:
    p, o = np.array(prompt, float), np.array(output, float)
    return JobWork(["m"] * len(p), np.array(release, float), np.array(deadline, float), p + o, p, p * p, o,
                   o * (p + o / 2), 1.0)


def test_one_pool_two_windows_by_hand():
    # job A: 2,000 + 2,000 tokens (4 s of work), due at 10 s; job C: 4,000 + 4,000 (8 s), due at 5 s.
    # Two 5-s intervals. C can only use the first: 5/8 of it (5,000 tokens); A fits in the second
    # (4,000 tokens). Every token costs the same 1 ms, so nothing beats 9,000.
    jw = jobs([2000, 4000], [2000, 4000], [0, 0], [10, 5])
    res = solve(jw, [LPPool("p", "p", "m", perf(), 1.0, (Phase.PREFILL, Phase.DECODE), 1e9, 1.0)], n_intervals=2)
    assert res.status == "optimal"
    assert res.objective_tokens == pytest.approx(9000)
    assert res.job_fraction == pytest.approx([1.0, 5 / 8])


def test_link_limits_disaggregation_by_hand():
    # prefill-only and decode-only pools: every job must move its KV (1 byte per prompt token)
    # over a 100 B/s link. 1,000 prompt tokens = 10 s of link time; the window is 5 s.
    jw = jobs([1000], [10], [0], [5])
    pools = [LPPool("a", "a", "m", perf(1.0), 1.0, (Phase.PREFILL,), 1e9, 1.0),
             LPPool("b", "b", "m", perf(1.0), 1.0, (Phase.DECODE,), 1e9, 1.0)]
    res = solve(jw, pools, n_intervals=1, links={("a", "b"): 100.0})
    assert res.job_fraction[0] == pytest.approx(0.5)
    assert res.kv_bytes == pytest.approx(500)
    # sizing mode: the cheapest fleet serving all of it
    sized = solve(jw, pools, n_intervals=1, size_pools=True)
    assert sized.job_fraction[0] == pytest.approx(1.0)
    assert sized.cost_per_hour == pytest.approx(1.0 * (1.0 / 5) + 1.0 * (0.01 / 5), rel=1e-6)


def _lost_at_start(*parents: str) -> SimpleNamespace:
    """Just what the LP reads of a fleet: its events (here: pools lost at t = 0)."""
    return SimpleNamespace(events=[FleetEvent(0.0, p, "loss") for p in parents])


def test_pools_together_serve_only_the_requests_one_of_them_can_hold():
    # One job: a small request (100 + 100 tokens) and a large one (900 + 100). Pools a and b hold
    # 500 tokens of KV per instance: only the small request fits either; pool c holds everything
    # but is lost at t = 0. Each of a, b alone may take 1/6 of the job's tokens; the two together
    # may not take 2/6 (the large request's tokens cannot be split between them), so the bound
    # serves exactly the small request: 200 tokens.
    jw = JobWork(["m"], np.array([0.0]), np.array([100.0]), np.array([1200.0]), np.array([1000.0]),
                 np.array([100.0**2 + 900.0**2]), np.array([200.0]), np.array([100 * 150.0 + 100 * 950.0]), 101.0,
                 requests=(np.array([0, 0]), np.array([100.0, 900.0]), np.array([100.0, 100.0])))
    small = InstancePerf("X", "m", 1, flops=1e12, flops_decode=1e12, bandwidth=1e12, weight_bytes=0.0,
                         kv_per_token=1.0, kv_capacity=500.0, two_p=1e9, dec_attn=0.0, pre_attn=0.0,
                         overhead=0.0, max_batch=1)
    pools = [LPPool(n, n, "m", small, 1.0, (Phase.PREFILL, Phase.DECODE), 1e9, 1.0) for n in ("a", "b")]
    pools.append(LPPool("c", "c", "m", perf(1.0), 1.0, (Phase.PREFILL, Phase.DECODE), 1e9, 1.0))
    res = solve(jw, pools, n_intervals=1, fleet=_lost_at_start("c"))
    assert res.status == "optimal"
    assert res.objective_tokens == pytest.approx(200.0)
    # without pool c no pool can ever hold the large request: the job is met by no policy, and the
    # bound leaves it out entirely
    alone = solve(jw, pools[:2], n_intervals=1)
    assert alone.status == "optimal" and alone.objective_tokens == 0.0


def test_bound_is_not_beaten_and_reacts_to_events(sim_inputs):
    tight = [{"name": "a", "weight": 2, "share": 0.5, "job_size": [20, 60], "deadline_s": [30, 60]},
             {"name": "b", "weight": 1, "share": 0.5, "job_size": [20, 60], "deadline_s": [30, 90]}]
    w, f, info = prepare(sim_inputs.workload(max_requests=1500, tenants=tight), sim_inputs.fleet(), load=1.3)
    b = deadline_bound(w, f)
    assert b["status"] == "optimal" and b["goodput_tok_s"] > 0
    for name in ("jsq", "rr", "split", "phaseroute"):
        _, m = run_policy(w, f, name)
        assert m["goodput_tok_s"] <= b["goodput_tok_s"] * (1 + 1e-6), name
    at = float(w.job_submit.min())
    lost = with_events(f, [FleetEvent(at, "h100", "loss")])
    assert deadline_bound(w, lost)["goodput_tok_s"] < b["goodput_tok_s"]
    assert max_throughput(w, f) == pytest.approx(info["capacity_tok_s"], rel=1e-3)


def test_max_throughput_scales_with_the_fleet(sim_inputs):
    w, f, _ = prepare(sim_inputs.workload(max_requests=500), sim_inputs.fleet())
    double = parse_fleet(sim_inputs.fleet(pools=[
        {"name": "h100", "accelerator": "H100-SXM-80GB", "count": 2, "models": ["llama-3.1-8b"]},
        {"name": "a100", "accelerator": "A100-SXM-40GB", "count": 4, "models": ["llama-3.1-8b"]}]))
    assert max_throughput(w, double) == pytest.approx(2 * max_throughput(w, f), rel=1e-2)


def test_requests_that_fit_no_instance_are_not_counted():
    """Job: a 1,000-token request and a 9,000-token one; pool b's instances hold 5,000 tokens of
    KV. Only a's share of the job can run on b; with a (the big pool) lost, 1,000 / 10,000 remain."""
    L, O = np.array([990.0, 8990.0]), np.array([10.0, 10.0])  # noqa: E741
    jw = JobWork(["m"], np.array([0.0]), np.array([100.0]), np.array([10000.0]), np.array([L.sum()]),
                 np.array([(L * L).sum()]), np.array([O.sum()]), np.array([(O * (L + O / 2)).sum()]), 991.0,
                 (np.array([0, 0]), L, O))
    small = InstancePerf("X", "m", 1, 1e15, 1e15, 1e15, 0.0, 1.0, 5000.0, 1e9, 0.0, 0.0, 0.0, 8)
    pools = [LPPool("a", "a", "m", perf(1.0), 1.0, (Phase.PREFILL, Phase.DECODE), 1e9, 1.0),
             LPPool("b", "b", "m", small, 1.0, (Phase.PREFILL, Phase.DECODE), 1e9, 1.0)]
    assert solve(jw, pools, 1, links={("a", "b"): 1e12, ("b", "a"): 1e12}).job_fraction[0] == pytest.approx(1.0)
    only_b = solve(jw, pools, 1, fleet=_lost_at_start("a"), links={("a", "b"): 1e12, ("b", "a"): 1e12})
    assert only_b.job_fraction[0] == pytest.approx(0.1)
    assert only_b.objective_tokens == pytest.approx(1000.0)
