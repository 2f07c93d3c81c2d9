"""Workload specs (trace -> jobs), fleet specs, bundled examples and their errors."""

from __future__ import annotations

import numpy as np
import pytest

from phaseroute.schemas.enums import Phase
from phaseroute.sim.errors import SpecError
from phaseroute.sim.fleet import load_fleet, parse_fleet
from phaseroute.sim.runner import prepare
from phaseroute.sim.specio import bundled
from phaseroute.sim.workload import build_workload, load_workload_spec, parse_workload


def test_jobs_from_trace(sim_inputs):
    spec = parse_workload(sim_inputs.workload(max_requests=3000))
    w = build_workload(spec)
    assert w.n_requests == 3000 and w.job_count.sum() == 3000
    assert (np.diff(w.job_first) == w.job_count[:-1]).all()
    for j in range(w.n_jobs):
        tenant = spec.tenants[w.job_tenant[j]]
        lo, hi = tenant.job_size
        assert w.job_count[j] <= hi and (w.job_count[j] >= lo or j == w.n_jobs - 1 or w.job_count[j] < lo)
        rel = w.job_deadline[j] - w.job_submit[j]
        assert tenant.deadline_s[0] <= rel <= tenant.deadline_s[1]
    assert (np.diff(w.job_submit) >= 0).all()
    shares = np.bincount(w.job_tenant, weights=w.job_count) / 3000
    assert abs(shares[0] - 0.4) < 0.05
    again = build_workload(spec)
    assert (again.req_prompt == w.req_prompt).all() and (again.job_deadline == w.job_deadline).all()


def test_replication_and_speedup(sim_inputs):
    one = build_workload(parse_workload(sim_inputs.workload()))
    three = build_workload(parse_workload(sim_inputs.workload(replicate=3, speedup=2.0)))
    assert three.n_requests == 3 * one.n_requests
    assert sorted(three.req_prompt.tolist()) == sorted(one.req_prompt.tolist() * 3)
    assert three.span_s < one.span_s / 1.8
    fast = one.rescaled(4.0)
    assert np.allclose(fast.job_submit, one.job_submit / 4)
    assert np.allclose(fast.job_deadline - fast.job_submit, one.job_deadline - one.job_submit)


@pytest.mark.parametrize("patch, expected", [
    ({"tenants": []}, "field 'tenants' must be a non-empty list"),
    ({"speed": 2}, "unknown field(s) ['speed']"),
    ({"speedup": 0}, "field 'speedup' must be > 0"),
    ({"trace": "/nowhere/x.csv"}, "trace '/nowhere/x.csv' not found"),
    ({"tenants": [{"name": "a", "deadline_min": [30, 10]}]}, "field 'deadline_min' must satisfy"),
    ({"tenants": [{"name": "a", "weight": "heavy"}]}, "field 'weight' must be a number, got 'heavy'"),
])
def test_workload_errors(sim_inputs, patch, expected):
    spec = sim_inputs.workload(**patch)
    with pytest.raises(SpecError) as err:
        parse_workload(spec, "w.yaml")
    assert "w.yaml" in str(err.value) and expected in str(err.value)


def test_fleet_spec(sim_inputs):
    f = parse_fleet(sim_inputs.fleet(events=[{"at_s": 10, "pool": "a100", "kind": "loss"}]))
    assert [p.name for p in f.pools] == ["h100", "a100"] and f.accelerators == 3
    assert f.pools[1].perf.tp == 1 and f.pools[1].instances == 2
    assert f.links[("h100", "a100")].bandwidth == pytest.approx(min(400e9 / 8, 2 * 50e9 / 8))
    assert f.events[0].kind == "loss"
    mixed = parse_fleet({"pools": [{"name": "big", "accelerator": "H100-SXM-80GB", "count": 8,
                                    "models": {"llama-3.1-8b": 0.5, "llama-3.1-70b": 0.5}}]})
    assert [(p.name, p.perf.tp, p.instances) for p in mixed.pools] == [("big/llama-3.1-8b", 1, 4), ("big/llama-3.1-70b", 4, 1)]


@pytest.mark.parametrize("patch, expected", [
    ({"pools": [{"name": "x", "accelerator": "B200", "count": 1, "models": ["llama-3.1-8b"]}]}, "unknown accelerator 'B200'"),
    ({"pools": [{"name": "x", "accelerator": "T4", "count": 1, "models": ["llama-3.1-8b"]}]}, "cannot hold one copy"),
    ({"pools": [{"name": "x", "accelerator": "T4", "count": 2, "models": ["gpt-5"]}]}, "unknown model 'gpt-5'"),
    ({"events": [{"at_s": 1, "pool": "zz", "kind": "loss"}]}, "unknown pool 'zz'"),
    ({"events": [{"at_s": 1, "pool": "h100", "kind": "melt"}]}, "must be one of"),
])
def test_fleet_errors(sim_inputs, patch, expected):
    with pytest.raises(SpecError, match=expected):
        parse_fleet(sim_inputs.fleet(**patch), "f.yaml")


FLEET_YAML = """
name: phases-test
pools:
  - {name: both, accelerator: H100-SXM-80GB, count: 1, models: [llama-3.1-8b]}
  - {name: pre, accelerator: H100-SXM-80GB, count: 1, models: [llama-3.1-8b], phases: [prefill]}
  - {name: mixed, accelerator: H100-SXM-80GB, count: 1, models: [llama-3.1-8b], phases: [decode, prefill]}
"""


def test_fleet_yaml_phases_parse_into_the_phase_enum(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET_YAML)
    f = load_fleet(path)
    assert [p.phases for p in f.pools] == [(Phase.PREFILL, Phase.DECODE), (Phase.PREFILL,), (Phase.DECODE, Phase.PREFILL)]
    assert all(type(ph) is Phase for p in f.pools for ph in p.phases)
    # the spec's spelling comes back out unchanged
    assert [p["phases"] for p in f.describe()["pools"]] == [["prefill", "decode"], ["prefill"], ["decode", "prefill"]]


@pytest.mark.parametrize("phases, expected", [
    ("[prefill, encode]", "got 'encode'"),
    ("[PREFILL]", "got 'PREFILL'"),           # the spec spelling is the lower-case slug
    ("[]", "must be a non-empty list"),
    ("prefill", "must be a non-empty list"),
    ("[decode, decode]", "lists a phase twice"),
])
def test_fleet_yaml_bad_phases_name_the_value_and_the_allowed_ones(tmp_path, phases, expected):
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET_YAML.replace("phases: [prefill]", f"phases: {phases}"))
    with pytest.raises(SpecError) as err:
        load_fleet(path)
    msg = str(err.value)
    assert "pools[1]" in msg and "'phases'" in msg and expected in msg
    if "got" in expected or "non-empty" in expected:
        assert "['prefill', 'decode']" in msg


def test_bundled_examples_load():
    assert {"azure-code", "mooncake", "bench-1m"} <= set(bundled("workload"))
    assert {"h100-a100", "l40s-a10g-t4", "bench-1000"} <= set(bundled("fleet"))
    for name in bundled("fleet"):
        load_fleet(name)
    assert load_fleet("bench-1000").accelerators == 1000
    for name in bundled("workload"):
        assert load_workload_spec(name).trace_path.is_file()


def test_load_scales_the_arrival_rate_not_the_window(sim_inputs):
    """prepare() overlays target / (one copy's load) copies, the fractional one thinned: the
    offered window stays the trace's at every load, so deadlines keep their meaning."""
    spec = parse_workload(sim_inputs.workload())
    one = build_workload(spec)
    half = build_workload(spec, copies=1.5)
    assert 1.4 * one.n_requests < half.n_requests < 1.6 * one.n_requests
    assert half.span_s == pytest.approx(one.span_s, rel=0.1)
    spans = []
    for load in (0.3, 1.0, 2.5):
        w, _, info = prepare(sim_inputs.workload(), sim_inputs.fleet(), load=load)
        assert info["offered_load"] == pytest.approx(load, rel=1e-3)
        spans.append(w.span_s)
    assert max(spans) < 1.1 * min(spans)
    with pytest.raises(ValueError, match="copies of the trace must be > 0, got 0"):
        build_workload(spec, copies=0)
