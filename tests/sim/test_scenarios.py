"""Stale profiles (a pool slows 4x mid-run) and pool loss (a pool disappears mid-job)."""

from __future__ import annotations

from phaseroute.sim.engine import SimConfig
from phaseroute.sim.runner import prepare
from phaseroute.sim.scenarios import pool_loss, stale_profile


def test_stale_profile_phaseroute_moves_work_away_static_spec_does_not(sim_inputs):
    w, f, _ = prepare(sim_inputs.workload(replicate=3, max_requests=20000), sim_inputs.fleet(), load=0.7)
    doc = stale_profile(w, f, ["phaseroute", "static-spec"], pool="h100", factor=4.0,
                        config=SimConfig(sample_s=5.0))
    assert doc["capacity_share_after"] < doc["capacity_share_before"]
    pr, static = doc["policies"]["phaseroute"], doc["policies"]["static-spec"]
    # phaseroute learns the slowdown from telemetry and sends less work there...
    assert pr["reaction_s"] is not None and pr["reaction_s"] < 0.5 * (w.job_submit.max() - doc["at_s"])
    assert pr["share_at_end"] < pr["share_before"] - 0.15
    # ...the static-spec router (datasheet rows that never update) never does
    assert static["reaction_s"] is None
    assert static["share_at_end"] > pr["share_at_end"] + 0.15


def test_pool_loss_replaces_in_flight_work(sim_inputs):
    w, f, _ = prepare(sim_inputs.workload(replicate=2, max_requests=8000), sim_inputs.fleet(), load=0.7)
    doc = pool_loss(w, f, ["phaseroute", "jsq"], pool="a100", config=SimConfig(sample_s=5.0))
    assert doc["bound_with"]["goodput_tok_s"] <= doc["bound_without"]["goodput_tok_s"]
    for name, p in doc["policies"].items():
        assert p["requests_replaced"] > 0, name            # in-flight work on the lost pool was re-placed
        assert p["requests_gave_up"] == 0 and p["jobs_failed"] == 0, name
        assert p["miss_rate_with"] >= p["miss_rate_without"], name
        assert p["goodput_with"] <= doc["bound_with"]["goodput_tok_s"] * (1 + 1e-6), name
