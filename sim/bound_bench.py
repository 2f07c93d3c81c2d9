"""``phaseroute sim bench-bound``: how long the LP bound takes at a given number of jobs.

The workload is built at the offered load that gives about ``jobs`` jobs (within 2%) on the
fleet (jobs grow with the trace copies a load needs), then the bound is solved by column generation,
once on the fleet as specified and once with a slowdown event (the stale-profile scenario's:
the largest pool 4x slower from 40% into the arrivals), optionally also by the exact LP for
comparison. Prints figures; asserts nothing (a benchmark, not a test).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from phaseroute.sim.bound import deadline_bound
from phaseroute.sim.fleet import FleetEvent, with_events
from phaseroute.sim.runner import prepare
from phaseroute.sim.scenarios import default_pool


def run_bound_bench(workload: str, fleet: str, jobs: int = 2000, exact: bool = False, slowdown: bool = True,
                    seed: int | None = None, log: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs!r}")
    t0 = time.perf_counter()
    load = 1.0
    w, f, info = prepare(workload, fleet, load, seed)
    for _ in range(4):          # jobs grow with the trace copies a load needs: a few corrections
        if abs(w.n_jobs - jobs) <= 0.02 * jobs:
            break
        load = round(load * jobs / max(w.n_jobs, 1), 3)
        w, f, info = prepare(workload, f, load, seed)
    doc: dict[str, Any] = {"workload": w.name, "fleet": f.name, "pools": len(f.pools), "jobs": w.n_jobs,
                 "requests": w.n_requests, "offered_load": info["offered_load"],
                 "prepare_s": round(time.perf_counter() - t0, 2), "runs": []}
    fleets = [("as specified", f)]
    if slowdown:
        at = float(w.job_submit.min() + 0.4 * w.span_s)
        fleets.append((f"slowdown 4x of {default_pool(f)} at {at:.0f} s",
                       with_events(f, [FleetEvent(at, default_pool(f), "slowdown", 4.0)])))
    for label, fl in fleets:
        for method in ("colgen", "exact") if exact else ("colgen",):
            log(f"bound ({method}, {label}) on {w.n_jobs} jobs ...")
            t = time.perf_counter()
            b = deadline_bound(w, fl, method=method)
            row = {"fleet": label, "method": method, "wall_s": round(time.perf_counter() - t, 2),
                   **{k: b[k] for k in ("status", "solve_s", "rounds", "columns_used", "variables", "intervals",
                                        "gap", "deadline_met_tokens", "job_fraction_mean", "jobs_fully_served")}}
            doc["runs"].append(row)
            log(f"  {row['wall_s']} s, {row['rounds']} rounds, {row['columns_used']} of {row['variables']} columns, "
                f"gap {row['gap']}, {row['status']}")
    return doc
