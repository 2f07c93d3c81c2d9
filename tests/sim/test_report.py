"""``sim report`` leads with capacity at SLO, then the sweep; it writes its plots and Markdown."""

from __future__ import annotations

import json

from phaseroute.sim.capacity import CapacityOptions
from phaseroute.sim.report import build_report


def test_report_leads_with_capacity(sim_inputs, tmp_path):
    opts = CapacityOptions(seeds=(3, 4, 5), start=0.5, tolerance=0.3, max_load=1.5, bound=False)
    results = build_report(sim_inputs.workload(max_requests=400), sim_inputs.fleet(), tmp_path, loads=(0.5, 0.7),
                           policies=["jsq", "split"], scenarios=False, log=lambda _m: None, capacity=opts,
                           bound=False)
    md = (tmp_path / "report.md").read_text()
    assert md.index("## Capacity at SLO") < md.index("## At the reference load") < md.index("## Load sweep")
    assert "phaseroute" not in results["capacity"]["ratios"]          # no phaseroute run: no ratio claimed
    for name in ("jsq", "split"):
        assert name in md and len(results["capacity"]["policies"][name]["capacity"]["per_seed"]) == 3
    for png in ("capacity.png", "goodput_vs_load.png", "miss_rate_vs_load.png", "pool_utilization.png"):
        assert (tmp_path / png).stat().st_size > 5_000, png
    assert "bound" not in json.loads((tmp_path / "results.json").read_text())["sweep"][0]
