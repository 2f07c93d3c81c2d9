"""The simulator itself: determinism, conservation of work, failures, the same policy code path."""

from __future__ import annotations

import json

import numpy as np
import pytest

from phaseroute.schemas.enums import JobState
from phaseroute.sim.engine import DONE, SimConfig, Simulator
from phaseroute.sim.runner import make_driver, prepare, run_policy


def _run(w, f, name, seed=0, **cfg):
    sim = Simulator(w, f, make_driver(name), SimConfig(seed=seed, **cfg)).run()
    return sim


@pytest.mark.parametrize("name", ["phaseroute", "split"])
def test_same_seed_same_result(sim_inputs, name):
    w, f, _ = prepare(sim_inputs.workload(max_requests=1200), sim_inputs.fleet(failures=True, pools=[
        {"name": "h100", "accelerator": "H100-SXM-80GB", "count": 1, "models": ["llama-3.1-8b"], "mtbf_hours": 0.02,
         "repair_minutes": 1},
        {"name": "a100", "accelerator": "A100-SXM-40GB", "count": 2, "models": ["llama-3.1-8b"], "mtbf_hours": 0.05,
         "repair_minutes": 1}]), load=0.8)
    a, b = _run(w, f, name, seed=4), _run(w, f, name, seed=4)
    assert a.counters["requests_lost"] > 0      # failures happened, and still the same result
    assert np.array_equal(a.t_done, b.t_done, equal_nan=True)  # nan: a speculative copy that lost
    assert a.job_state == b.job_state and a.counters == b.counters
    from phaseroute.sim.metrics import compute_metrics
    assert json.dumps(compute_metrics(a), default=str) == json.dumps(compute_metrics(b), default=str)
    c = _run(w, f, name, seed=5)
    assert not np.array_equal(c.t_done[: w.n_requests], a.t_done[: w.n_requests], equal_nan=True)  # the seed matters


@pytest.mark.parametrize("name", ["phaseroute", "static-spec", "rr", "jsq", "split"])
def test_every_request_completes_once(sim_inputs, name):
    w, f, _ = prepare(sim_inputs.workload(max_requests=800), sim_inputs.fleet(), load=0.6)
    sim, m = run_policy(w, f, name)
    if m["jobs_rejected"] == 0:
        assert all(s == DONE for s in sim.status[: w.n_requests])  # later rows: speculative copies
        assert m["completed_tokens"] == float((w.req_prompt + w.req_output).sum())
    assert sim.inflight == 0 and all(p.running == 0 for p in sim.pools)
    assert all(not p.q_pre and not p.q_dec for p in sim.pools)
    assert m["jobs_met"] + m["jobs_late"] + m["jobs_rejected"] + m["jobs_failed"] + m["jobs_unfinished"] == w.n_jobs
    total = sum(p["prefill_tokens"] for p in m["pools"].values())
    done = np.array([s == DONE for s in sim.status[: w.n_requests]])
    copies = sum(sim.prompt[r] for r in range(w.n_requests, len(sim.status)) if sim.status[r] == DONE)
    assert total >= (float(w.req_prompt[done].sum()) + copies) * (1 - 1e-5)  # every finished row was prefilled


def test_simulator_runs_the_live_control_core(sim_inputs, monkeypatch):
    """The simulator's phaseroute policy is the ControlCore the Faust app runs: every decision
    (admit, fair release, route, retry, pool loss) happens inside ControlCore.handle / tick,
    and the policy functions it calls are the very ones of phaseroute.streams.policy."""
    import phaseroute.streams.core.core as core_module
    import phaseroute.streams.policy as policy
    from phaseroute.streams.core import ControlCore

    calls: dict[str, int] = {}
    inside = {"depth": 0}

    def spy(owner, attr, outside_ok=False):
        original = getattr(owner, attr)

        def wrapper(*args, **kwargs):
            calls[attr] = calls.get(attr, 0) + 1
            if not outside_ok:
                assert inside["depth"] > 0, f"{attr} was called outside the control core"
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, attr, wrapper)

    def enter(attr):
        original = getattr(ControlCore, attr)

        def wrapper(self, *args, **kwargs):
            calls[f"core.{attr}"] = calls.get(f"core.{attr}", 0) + 1
            inside["depth"] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                inside["depth"] -= 1

        monkeypatch.setattr(ControlCore, attr, wrapper)

    enter("handle")
    enter("tick")
    import phaseroute.streams.core.admission as admission_module
    import phaseroute.streams.core.dispatcher as dispatcher_module
    import phaseroute.streams.core.recovery as recovery_module
    for module, attr in ((dispatcher_module, "route"), (admission_module, "admit"), (dispatcher_module, "next_step"),
                         (recovery_module, "redispatch_lost")):
        spy(module, attr)
    for attr in ("schedule", "enqueue", "on_finished"):
        spy(policy.FairScheduler, attr)
    spy(policy.RouterState, "refresh")
    assert core_module.ControlCore is ControlCore
    fleet = sim_inputs.fleet(failures=True, events=[{"at_s": 60, "pool": "a100", "kind": "loss"}], pools=[
        {"name": "h100", "accelerator": "H100-SXM-80GB", "count": 1, "models": ["llama-3.1-8b"], "mtbf_hours": 0.01,
         "repair_minutes": 1},
        {"name": "a100", "accelerator": "A100-SXM-40GB", "count": 2, "models": ["llama-3.1-8b"]}])
    w, f, _ = prepare(sim_inputs.workload(max_requests=2000), fleet, load=0.8)
    sim, m = run_policy(w, f, "phaseroute")
    assert type(sim.driver.core) is ControlCore and sim.driver.problems == []
    for name in ("route", "admit", "schedule", "enqueue", "on_finished", "refresh", "next_step", "redispatch_lost",
                 "core.handle", "core.tick"):
        assert calls.get(name, 0) > 0, f"{name} was never called"
    admitted = sum(int(w.job_count[j]) for j in range(w.n_jobs) if sim.job_state[j] is not JobState.REJECTED)
    assert calls["route"] >= admitted > 0 and calls["admit"] == w.n_jobs
    # the static-spec router is the same core on datasheet rows
    before = calls["route"]
    sim2, _ = run_policy(w, f, "static-spec")
    assert type(sim2.driver.core) is ControlCore
    admitted = sum(int(w.job_count[j]) for j in range(w.n_jobs) if sim2.job_state[j] is not JobState.REJECTED)
    assert calls["route"] >= before + admitted > before


def test_live_names_exist_in_the_policy_package():
    """The names the simulator calls are the policy's public API (the live agents call the same)."""
    import phaseroute.streams.policy as policy

    for name in ("route", "admit", "build_profile_rows", "build_link_profiles", "next_step", "redispatch_lost",
                 "FairScheduler", "RouterState", "ProfileTable", "PoolState", "RequestWork"):
        assert name in policy.__all__


def test_a_request_no_instance_can_hold_is_refused_not_blocking(tmp_path):
    """A 60k-token prompt fits the H100 prefill pool but no A10G decode instance (42k KV tokens).
    phaseroute's admission rejects its job up front (the workers report their KV capacity), and
    so does the split baseline's submission check (the same physical limits for every policy,
    sim/limits.py), naming the request and the limit. The small requests behind it finish."""
    from phaseroute.sim.fleet import parse_fleet
    from phaseroute.sim.workload import build_workload, parse_workload

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {i * 100}, "input_length": {n}, "output_length": 20}}\n'
                             for i, n in enumerate([500, 60000, 700, 800])))
    w = build_workload(parse_workload({"trace": str(trace), "model": "llama-3.1-8b",
                                       "tenants": [{"name": "a", "job_size": [1, 1], "deadline_min": [10, 10]}]}))
    f = parse_fleet({"failures": False, "pools": [
        {"name": "h100", "accelerator": "H100-SXM-80GB", "count": 1, "models": ["llama-3.1-8b"], "phases": ["prefill"]},
        {"name": "a10g", "accelerator": "A10G", "count": 1, "models": ["llama-3.1-8b"], "phases": ["decode"]}]})
    for name in ("split", "phaseroute"):
        sim, m = run_policy(w, f, name)
        assert m["jobs_met"] == 3 and m["jobs"] == 4, name
        assert sim.status[1] != DONE, name
        assert m["jobs_rejected"] == 1 and m["no_placement"] == 0 and sim.job_state[1] is JobState.REJECTED, name
        if name == "split":
            assert sim.job_reason[1] == ("infeasible: request 1 of job 1: decode needs KV for 60020 tokens on one "
                                         "instance; the largest decode instance of 'llama-3.1-8b' holds 42266")
        assert all(p.running == 0 and not p.q_pre and not p.q_dec for p in sim.pools), name


def test_a_request_stranded_by_a_pool_loss_gives_up_after_its_deadline(tmp_path):
    """The 60k-token request fits only the H100 pool, which disappears at 0.5 s: no A10G instance
    can hold it (42k KV tokens). phaseroute retries it until ``give_up_unplaced`` (a 60 s wait here,
    and the 10-minute deadline passed) fails it and its job; the run then ends instead of idling
    to its horizon. The other jobs meet their deadlines."""
    from phaseroute.sim.core_driver import CoreDriver, PhaserouteOptions
    from phaseroute.sim.fleet import parse_fleet
    from phaseroute.sim.workload import build_workload, parse_workload
    from phaseroute.streams.policy import RetryConfig

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"timestamp": {i * 100}, "input_length": {n}, "output_length": 200}}\n'
                             for i, n in enumerate([500, 60000, 700, 800])))
    w = build_workload(parse_workload({"trace": str(trace), "model": "llama-3.1-8b",
                                       "tenants": [{"name": "a", "job_size": [1, 1], "deadline_min": [10, 10]}]}))
    f = parse_fleet({"failures": False, "events": [{"at_s": 0.5, "pool": "h100", "kind": "loss"}], "pools": [
        {"name": "h100", "accelerator": "H100-SXM-80GB", "count": 1, "models": ["llama-3.1-8b"]},
        {"name": "a10g", "accelerator": "A10G", "count": 1, "models": ["llama-3.1-8b"]}]})
    driver = CoreDriver(PhaserouteOptions(retry=RetryConfig(unplaced_give_up_s=60.0)))
    sim, m = run_policy(w, f, "phaseroute", driver=driver)
    deadline = float(w.job_deadline[1])
    assert sim.job_state == [JobState.COMPLETED, JobState.FAILED, JobState.COMPLETED, JobState.COMPLETED] and m["jobs_met"] == 3
    assert m["requests_gave_up"] == 1 and m["no_placement"] > 1
    assert sim.job_reason[1].startswith("no pool could place it for ") and "its deadline has passed" in sim.job_reason[1]
    assert deadline <= sim.now < deadline + 10, "it gives up once the deadline has passed, not before"


def test_routing_backoff_is_bounded():
    from phaseroute.sim.engine import backoff

    assert [backoff(k, 1.0, 5.0) for k in (1, 2, 3, 4)] == [1.0, 2.0, 4.0, 5.0]
    assert backoff(10_000, 1.0, 5.0) == 5.0      # a request refused for hours must not overflow


def test_tenant_shares_follow_weights_under_phaseroute_not_fifo(sim_inputs):
    """Overloaded (1.5x), two tenants weighted 3:1: phaseroute's fair scheduler releases work
    in proportion to weight while both are backlogged; the FIFO baselines do not."""
    w, f, _ = prepare(sim_inputs.workload(max_requests=3000, seed=1), sim_inputs.fleet(), load=1.5)
    _, pr = run_policy(w, f, "phaseroute")
    _, fifo = run_policy(w, f, "jsq")
    gold_pr, gold_fifo = pr["tenants"]["gold"], fifo["tenants"]["gold"]
    assert abs(gold_pr["contended_share"] - gold_pr["fair_share_when_contended"]) < 0.05
    assert abs(gold_fifo["contended_share"] - gold_fifo["fair_share_when_contended"]) > 0.2
