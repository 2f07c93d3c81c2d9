"""The same physical limits for every policy and the bound: context length, KV of one instance, placement."""

from __future__ import annotations

import numpy as np
import pytest

from phaseroute.schemas.enums import JobState
from phaseroute.sim.bound import deadline_bound, job_work, lp_pools, max_throughput, solve
from phaseroute.sim.fleet import parse_fleet
from phaseroute.sim.limits import PoolLimits, feasible_requests, infeasible_jobs, why_infeasible
from phaseroute.sim.runner import POLICIES, run_policy
from phaseroute.sim.workload import build_workload, parse_workload

CONTEXT = 131072   # llama-3.1-8b


def _one_request_per_job(tmp_path, prompts: list[int], output: int = 20):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {i * 2000}, "input_length": {n}, "output_length": {output}}}\n'
                             for i, n in enumerate(prompts)))
    return build_workload(parse_workload({"trace": str(trace), "model": "llama-3.1-8b", "tenants": [
        {"name": "a", "job_size": [1, 1], "deadline_min": [30, 30]}]}))


def _h100_fleet(**extra):
    # one H100 holds ~427k tokens of KV: every prompt here fits its memory, so only the context binds
    return parse_fleet({"failures": False, "pools": [
        {"name": "h100", "accelerator": "H100-SXM-80GB", "count": 2, "models": ["llama-3.1-8b"]}], **extra})


def test_a_prompt_over_the_context_is_a_miss_for_every_policy_and_left_out_of_the_bound(tmp_path):
    prompts = [900, CONTEXT + 5000, 1200, CONTEXT - 10, 800, 150000]   # 131,062 + 20 output > context too
    w = _one_request_per_job(tmp_path, prompts)
    f = _h100_fleet()
    bad = infeasible_jobs(f, w)
    over = [(p + 20) > CONTEXT for p in prompts]
    assert list(bad[np.argsort(w.job_first)]) == over and bad.sum() == 3
    for name in POLICIES:
        sim, m = run_policy(w, f, name)
        assert m["jobs_infeasible"] == 3, name
        assert m["jobs_met"] == 3 and m["jobs_rejected"] == 3, name        # refused at submission, not served
        assert m["miss_rate"] == pytest.approx(0.5), name
        for j in np.flatnonzero(bad):
            assert sim.job_state[j] is JobState.REJECTED, name
        served = sum(m["pools"][p]["prefill_tokens"] for p in m["pools"])
        assert served == pytest.approx(float(w.req_prompt[~bad[w.req_job]].sum()), abs=2), name   # none on them
    b = deadline_bound(w, f)
    feasible_tokens = float(w.job_tokens[~bad].sum())
    assert b["jobs_infeasible"] == 3
    assert b["deadline_met_tokens"] <= feasible_tokens * (1 + 1e-9)
    assert b["deadline_met_tokens"] == pytest.approx(feasible_tokens, rel=1e-6)   # the rest fits easily
    exact = solve(job_work(w), lp_pools(f), 48, f)
    assert exact.job_fraction[bad].max() == 0.0
    # the fleet's capacity counts only what it can serve (the workload's feasible mix)
    assert max_throughput(w, f) > 0


def test_kv_capacity_and_placement_bind_the_same_way_everywhere(tmp_path):
    """A 60k-token request fits an H100 (prefill) but no A10G (decode, 42k KV tokens); a model no
    pool holds is infeasible too. The baselines' routing filter, their submission check and the
    bound all read these limits from sim/limits.py."""
    f = parse_fleet({"failures": False, "pools": [
        {"name": "h100", "accelerator": "H100-SXM-80GB", "count": 1, "models": ["llama-3.1-8b"], "phases": ["prefill"]},
        {"name": "a10g", "accelerator": "A10G", "count": 1, "models": ["llama-3.1-8b"], "phases": ["decode"]}]})
    limits = [PoolLimits.of(p) for p in f.pools]
    ok = feasible_requests(limits, np.array([500, 60000, 40000]), np.array([20, 20, 20]), ["llama-3.1-8b"] * 3)
    assert list(ok) == [True, False, True]
    assert "decode needs KV for 60020 tokens" in why_infeasible(limits, 60000, 20, "llama-3.1-8b")
    assert why_infeasible(limits, 500, 20, "qwen2.5-7b") == "no pool holds model 'qwen2.5-7b'"
    assert why_infeasible(limits, 140000, 20, "llama-3.1-8b").startswith("prompt 140000 + output 20 tokens > context")
    assert why_infeasible(limits, 500, 20, "llama-3.1-8b") is None
    w = _one_request_per_job(tmp_path, [500, 60000, 40000])
    b = deadline_bound(w, f)
    assert b["jobs_infeasible"] == 1
    for name in ("split", "jsq", "phaseroute"):
        _, m = run_policy(w, f, name)
        assert m["jobs_infeasible"] == 1 and m["jobs_met"] <= 2, name
        assert m["goodput_tok_s"] <= b["goodput_tok_s"] * (1 + 1e-6), name
