"""The capacity planner on a tiny catalogue, calibration, and the CLI's JSON."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from phaseroute.cli.sim_cmds import plan_app, sim_app
from phaseroute.schemas.enums import Phase
from phaseroute.sim.calibrate import calibrate, load_points
from phaseroute.sim.errors import SpecError
from phaseroute.sim.planner import PlanOptions, plan
from phaseroute.sim.specio import DATA_DIR
from phaseroute.sim.workload import build_workload, parse_workload


def test_planner_on_a_tiny_catalogue(sim_inputs):
    w = build_workload(parse_workload(sim_inputs.workload(max_requests=1500)))
    doc = plan(w, {"candidates": ["H100-SXM-80GB", "L4", "A10G"]},
               PlanOptions(max_types=2, confirm=2, policy="jsq", target_miss_rate=0.0))
    assert doc["candidates_considered"] == 6    # 3 singles + 3 pairs
    costs = [c["lp_cost_per_hour"] for c in doc["candidates"]]
    assert costs == sorted(costs)
    choice = doc["choice"]
    assert choice["meets_target"] and choice["miss_rate"] == 0.0
    assert choice["cost_per_hour"] >= choice["lp_cost_per_hour"] - 1e-9   # the LP is a lower bound on cost
    for p in choice["placement"].values():
        assert p["model"] == "llama-3.1-8b" and p["instances"] >= 1
        assert 0.0 <= p["prefill_share_of_busy_time"] <= 1.0
    # the recommended fleet is a valid fleet spec
    from phaseroute.sim.fleet import parse_fleet
    assert parse_fleet(choice["fleet_spec"]).cost_per_hour == choice["cost_per_hour"]


def test_calibration_recovers_known_efficiencies():
    acc, model, tp, points = load_points(DATA_DIR / "calibration-cpu-smollm2.yaml")
    fit = calibrate(acc, model, tp, points)
    assert fit["rms_log_error"] < 0.3
    # synthetic points from the model itself are fitted exactly
    from phaseroute.sim.calibrate import Point, predict
    from phaseroute.sim.catalogue import load_catalogue
    from phaseroute.sim.perfmodel import Efficiency
    cat = load_catalogue()
    truth = Efficiency(compute=0.4, decode_compute=0.2, memory=0.6, step_overhead_s=0.004, tp_scaling=1.0)
    pts = [Point(Phase.PREFILL, 1, 512, 0), Point(Phase.PREFILL, 4, 512, 0), Point(Phase.DECODE, 1, 256, 0),
           Point(Phase.DECODE, 16, 256, 0), Point(Phase.DECODE, 128, 256, 0), Point(Phase.DECODE, 64, 4096, 0)]
    rates = predict(pts, cat.accelerators["L4"], cat.models["qwen2.5-7b"], 1, truth)
    pts = [Point(p.phase, p.batch_size, p.tokens, float(r)) for p, r in zip(pts, rates)]
    fit = calibrate("L4", "qwen2.5-7b", 1, pts)
    assert fit["rms_log_error"] < 1e-3
    assert abs(fit["efficiency"]["memory"] - 0.6) < 0.02 and abs(fit["efficiency"]["compute"] - 0.4) < 0.02


def test_calibration_points_read_the_phase_slug_and_name_a_bad_one():
    spec = {"accelerator": "L4", "model": "qwen2.5-7b",
            "points": [{"phase": "decode", "batch_size": 8, "context_tokens": 128, "tokens_per_s": 76}]}
    assert load_points(spec)[3][0].phase is Phase.DECODE
    spec["points"][0]["phase"] = "Decode"
    with pytest.raises(SpecError, match=r"points\[0\]: field 'phase' must be one of \['prefill', 'decode'\], got 'Decode'"):
        load_points(spec)


def _app() -> typer.Typer:
    app = typer.Typer()
    app.add_typer(sim_app, name="sim")
    app.add_typer(plan_app, name="plan")
    return app


def test_cli_sim_json(sim_inputs, tmp_path):
    wpath, fpath = tmp_path / "w.json", tmp_path / "f.json"
    wpath.write_text(json.dumps(sim_inputs.workload(max_requests=600)))
    fpath.write_text(json.dumps(sim_inputs.fleet()))
    res = CliRunner().invoke(_app(), ["sim", "--workload", str(wpath), "--fleet", str(fpath), "--load", "0.7", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(doc["policies"]) == {"phaseroute", "static-spec", "rr", "jsq", "split"}
    assert doc["bound"]["goodput_tok_s"] > 0 and doc["offered_load"] == 0.7
    for m in doc["policies"].values():
        assert {"goodput_tok_s", "miss_rate", "cost_per_million_tokens", "goodput_tokens_per_dollar", "pools",
                "kv_bytes_moved", "tenants", "requests_retried", "requests_speculated"} <= set(m)
    bad = CliRunner().invoke(_app(), ["sim", "--workload", str(wpath), "--fleet", "nowhere.yaml"])
    assert bad.exit_code == 1 and "fleet spec 'nowhere.yaml'" in bad.output


def test_cli_plan_and_calibrate(sim_inputs, tmp_path):
    wpath = tmp_path / "w.json"
    wpath.write_text(json.dumps(sim_inputs.workload(max_requests=400)))
    cat = tmp_path / "c.yaml"
    cat.write_text("candidates: [L4, A10G]\n")
    res = CliRunner().invoke(_app(), ["plan", "--workload", str(wpath), "--catalogue", str(cat), "--policy", "jsq",
                                      "--confirm", "1", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["choice"]["types"]
    res = CliRunner().invoke(_app(), ["sim", "calibrate", str(DATA_DIR / "calibration-cpu-smollm2.yaml")])
    assert res.exit_code == 0 and "efficiency" in json.loads(res.stdout)
