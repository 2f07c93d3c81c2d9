"""Column generation against the exact LP on small cases: same optimum, and a dual bound that never undercuts it."""

from __future__ import annotations

import numpy as np
import pytest

from phaseroute.schemas.enums import Phase
from phaseroute.sim.bound import deadline_bound, miss_rate_bound, solve
from phaseroute.sim.bound_colgen import solve_colgen
from phaseroute.sim.bound_model import JobWork, LPPool, build_model
from phaseroute.sim.fleet import FleetEvent, with_events
from phaseroute.sim.perfmodel import InstancePerf
from phaseroute.sim.runner import prepare, run_policy


def _perf(flops: float, bandwidth: float, kv_capacity: float) -> InstancePerf:
    return InstancePerf("X", "m", 1, flops=flops, flops_decode=flops, bandwidth=bandwidth, weight_bytes=1e6,
                        kv_per_token=10.0, kv_capacity=kv_capacity, two_p=1e10, dec_attn=1e3, pre_attn=1e3,
                        overhead=1e-3, max_batch=16)


def _random_case(seed: int) -> tuple[JobWork, list[LPPool], dict]:
    """Jobs of random sizes and windows on a compute pool, a memory pool and a small colocated
    pool, with a slow link: contended, so the optimum serves only part of the work."""
    rng = np.random.default_rng(seed)
    n_jobs, per_job = 12, 5
    L = rng.integers(100, 4000, n_jobs * per_job).astype(float)
    O = rng.integers(10, 400, n_jobs * per_job).astype(float)  # noqa: E741
    group = np.repeat(np.arange(n_jobs), per_job)
    def sums(v: np.ndarray) -> np.ndarray:
        return np.bincount(group, weights=v, minlength=n_jobs)
    release = rng.uniform(0, 50, n_jobs)
    deadline = release + rng.uniform(5, 60, n_jobs)
    jw = JobWork(["m"] * n_jobs, release, deadline, sums(L + O), sums(L), sums(L * L), sums(O),
                 sums(O * (L + O / 2)), float(L.min() + 1), (group, L, O))
    pools = [LPPool("fast", "fast", "m", _perf(4e12, 1e11, 5e5), 1.0, (Phase.PREFILL,), 1e9, 4.0),
             LPPool("wide", "wide", "m", _perf(1e12, 4e11, 5e5), 1.0, (Phase.DECODE,), 1e9, 2.0),
             LPPool("small", "small", "m", _perf(1e12, 1e11, 3e4), 1.0, (Phase.PREFILL, Phase.DECODE), 1e9, 1.0)]
    links = {(a, b): 2e6 for a in ("fast", "wide", "small") for b in ("fast", "wide", "small") if a != b}
    return jw, pools, links


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_column_generation_finds_the_exact_optimum(seed):
    jw, pools, links = _random_case(seed)
    exact = solve(jw, pools, 12, links=links)
    assert exact.status == "optimal"
    served = exact.objective_tokens / jw.tokens.sum()
    assert 0.05 < served < 0.95              # contended: the case tests something
    res = solve_colgen(build_model(jw, pools, 12, links=links), rel_gap=1e-7)
    assert res.status == "optimal"
    assert res.upper_bound >= exact.objective_tokens * (1 - 1e-7)      # the dual bound is an upper bound
    assert res.upper_bound == pytest.approx(exact.objective_tokens, rel=1e-5)
    assert res.objective_tokens <= exact.objective_tokens * (1 + 1e-7)  # the master is a restriction
    assert res.columns_used < res.variables                            # it did not need every column


@pytest.mark.parametrize("seed", [1, 5])
def test_the_dual_bound_holds_when_stopped_early(seed):
    jw, pools, links = _random_case(seed)
    exact = solve(jw, pools, 12, links=links)
    early = solve_colgen(build_model(jw, pools, 12, links=links), max_rounds=1)
    assert early.rounds == 1 and early.status.startswith("stopped after 1 rounds")
    assert early.upper_bound >= exact.objective_tokens * (1 - 1e-7)
    assert early.objective_tokens <= exact.objective_tokens * (1 + 1e-7)


def test_both_methods_agree_on_a_real_trace_with_a_slowdown_and_a_pool_loss(sim_inputs):
    """Fleet events give intervals of zero capacity (the lost pool) and of higher cost (the slowed
    one): the pricing must skip the dead columns and still match the exact LP."""
    tight = [{"name": "a", "weight": 2, "share": 0.5, "job_size": [10, 40], "deadline_s": [30, 120]},
             {"name": "b", "weight": 1, "share": 0.5, "job_size": [10, 40], "deadline_s": [60, 240]}]
    w, f, _ = prepare(sim_inputs.workload(max_requests=1500, tenants=tight), sim_inputs.fleet(), load=3.0)
    start = float(w.job_submit.min())
    hit = with_events(f, [FleetEvent(start + 0.3 * w.span_s, "h100", "slowdown", 3.0),
                          FleetEvent(start + 0.6 * w.span_s, "a100", "loss")])
    cg = deadline_bound(w, hit, 40, method="colgen")
    exact = deadline_bound(w, hit, 40, method="exact")
    assert cg["status"] == exact["status"] == "optimal"
    assert cg["deadline_met_tokens"] >= exact["deadline_met_tokens"] * (1 - 1e-7)
    assert cg["deadline_met_tokens"] == pytest.approx(exact["deadline_met_tokens"], rel=2e-4)
    assert exact["job_fraction_mean"] < 0.999     # the events bite
    assert cg["columns_used"] < cg["variables"]


def test_miss_rate_bound_is_below_every_policy(sim_inputs):
    tight = [{"name": "a", "weight": 2, "share": 0.5, "job_size": [10, 30], "deadline_s": [10, 30]},
             {"name": "b", "weight": 1, "share": 0.5, "job_size": [10, 30], "deadline_s": [10, 30]}]
    w, f, _ = prepare(sim_inputs.workload(max_requests=1200, tenants=tight), sim_inputs.fleet(), load=4.0)
    lower = miss_rate_bound(w, f)
    assert lower["status"] == "optimal"
    assert 0.0 < lower["miss_rate_lower_bound"] < 1.0
    for name in ("jsq", "phaseroute"):
        _, m = run_policy(w, f, name)
        assert m["miss_rate"] >= lower["miss_rate_lower_bound"] - 1e-9, name
