"""Capacity at SLO: the search itself, and a small study over seeds with the bound and the plot."""

from __future__ import annotations

import json

import pytest

from phaseroute.sim.capacity import CapacityOptions, LoadPoints, capacity_study, find_capacity
from phaseroute.sim.capacity_plot import plot_capacity


def _step(threshold: float):
    calls = []

    def measure(load: float) -> dict:
        calls.append(load)
        return {"miss_rate": 0.0 if load <= threshold else 0.3}
    return measure, calls


@pytest.mark.parametrize("threshold", [0.37, 1.0, 1.37, 2.9])
def test_the_search_brackets_and_bisects_to_the_tolerance(threshold):
    opts = CapacityOptions(tolerance=0.05)
    measure, calls = _step(threshold)
    s = find_capacity(measure, 0.02, 1.0, 1.5, opts)
    assert s.status == "found"
    assert s.capacity <= threshold < s.capacity * 1.05 + opts.grid      # within the tolerance (and the grid)
    assert [p["load"] for p in s.points] == calls and len(calls) <= 8
    assert all(round(x / opts.grid, 6).is_integer() for x in calls)     # loads on the shared grid


def test_the_search_reports_where_it_stopped_at_either_end():
    opts = CapacityOptions(max_load=3.0, min_load=0.2)
    top = find_capacity(_step(99.0)[0], 0.02, 1.0, 1.5, opts)
    assert (top.capacity, top.status) == (3.0, "at_max")
    bottom = find_capacity(_step(0.01)[0], 0.02, 1.0, 1.5, opts)
    assert (bottom.capacity, bottom.status) == (None, "below_min")


@pytest.mark.parametrize(("field", "value"), [("slo", 1.0), ("step", 1.0), ("seeds", ()), ("start", 9.0)])
def test_bad_options_are_refused_with_their_value(field, value):
    with pytest.raises(ValueError, match=f"capacity option {field} must be"):
        CapacityOptions(**{field: value})


def test_a_small_study_over_three_seeds(sim_inputs, tmp_path):
    # deadlines well inside the arrival window at every load tried, so misses grow with load
    tight = [{"name": "a", "weight": 2, "share": 0.5, "job_size": [5, 15], "deadline_s": [20, 40]},
             {"name": "b", "weight": 1, "share": 0.5, "job_size": [5, 15], "deadline_s": [40, 80]}]
    workload = sim_inputs.workload(max_requests=1000, tenants=tight)
    opts = CapacityOptions(seeds=(3, 4, 5), start=0.5, tolerance=0.2, max_load=2.0)
    doc = capacity_study(workload, sim_inputs.fleet(), ["jsq", "phaseroute"], opts)
    json.dumps(doc)                                            # one JSON-ready document
    assert doc["drivers"]["jsq"] == "phaseroute.sim.drivers"
    for name, p in doc["policies"].items():
        assert p["status"] == ["found"] * 3, name
        c = p["capacity"]
        assert c["min"] <= c["mean"] <= c["max"] and len(c["per_seed"]) == 3
        for seed, cap in zip(opts.seeds, c["per_seed"], strict=True):
            pts = p["points"][str(seed)]
            at = [q for q in pts if q["load"] == cap]
            assert at and at[-1]["miss_rate"] <= opts.slo, (name, seed)
            above = [q["miss_rate"] for q in pts if q["load"] > cap]
            assert above and min(above) > opts.slo, (name, seed)      # the next point tried fails the SLO
            assert all(q["load"] <= cap or q["miss_rate"] > opts.slo for q in pts)
        assert p["goodput_tokens_per_dollar_at_capacity"]["mean"] > 0
        # no policy carries more than the bound (it never misses fewer jobs than the LP's lower bound)
        for k in range(3):
            assert c["per_seed"][k] <= doc["bound"]["capacity"]["per_seed"][k] * (1 + opts.tolerance) + opts.grid
    ratio = doc["ratios"]["phaseroute_vs_best_baseline"]
    best = ratio["best_baseline"]
    assert best == "jsq"
    mine, theirs = (doc["policies"][n]["capacity"]["mean"] for n in ("phaseroute", best))
    assert ratio["of_means"] == pytest.approx(mine / theirs, abs=1e-3)
    png = plot_capacity(doc, tmp_path / "capacity.png")
    assert png.stat().st_size > 10_000


def test_points_are_shared_between_policies(sim_inputs):
    points = LoadPoints(sim_inputs.workload(max_requests=300), sim_inputs.fleet())
    a = points.get(3, 1.0)
    assert points.get(3, 1.0) is a and points.get(4, 1.0) is not a
