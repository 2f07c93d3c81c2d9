"""``phaseroute sim bench``: how fast the simulator runs, and what the policy calls cost.

Runs each requested policy on the benchmark workload and fleet (by default one million
requests on 1,000 accelerators) and prints wall time, events per second and requests per
second. For the phaseroute drivers, every policy entry point the driver calls is wrapped
with a timer (on the ``phaseroute.streams.policy`` module, for this process only), so the
output says how much of the wall time each policy call takes and which one dominates.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from phaseroute.schemas.enums import JobState
from phaseroute.sim.engine import SimConfig, Simulator
from phaseroute.sim.runner import make_driver, prepare
from phaseroute.streams import policy as P
from phaseroute.streams.core import core as core_core
from phaseroute.streams.core import dispatcher as core_dispatcher
from phaseroute.streams.core import jobs as core_jobs
from phaseroute.streams.core import recovery as core_recovery

# Entry points the driver calls (a few per request at most): a timer costs well under a
# microsecond a call, so it does not distort the wall time it is measuring. Calls made inside
# ``route`` (8 profile lookups, 4 PoolStates per request) are not wrapped: timing them would.
TIMED = ("route", "admit", "build_profile_rows", "build_link_profiles", "next_step",
         "redispatch_lost", "fleet_tokens_per_s")
CORE_MODULES = (core_core, core_dispatcher, core_jobs, core_recovery)
TIMED_METHODS = (("FairScheduler", "schedule"), ("FairScheduler", "enqueue"), ("FairScheduler", "on_finished"),
                 ("RouterState", "record"), ("RouterState", "refresh"))


@contextmanager
def timed_policy() -> Iterator[dict[str, list[float]]]:
    """Wrap the policy's entry points with timers; yields {name: [calls, seconds]}."""
    stats: dict[str, list[float]] = {}
    undo: list[tuple[object, str, Any]] = []

    def wrap(owner: object, attr: str, label: str) -> None:
        fn = getattr(owner, attr)
        acc = stats.setdefault(label, [0, 0.0])

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[0] += 1
                acc[1] += time.perf_counter() - t0

        setattr(owner, attr, timed)
        undo.append((owner, attr, fn))

    for name in TIMED:
        if hasattr(P, name):
            original = getattr(P, name)
            wrap(P, name, name)
            # The control core imports these by name (``from phaseroute.streams.policy import
            # route``): its modules' own references are wrapped too, or its calls go untimed.
            for module in CORE_MODULES:
                if getattr(module, name, None) is original:
                    wrap(module, name, name)
    for cls, meth in TIMED_METHODS:
        if hasattr(getattr(P, cls, None), meth):
            wrap(getattr(P, cls), meth, f"{cls}.{meth}")
    try:
        yield stats
    finally:
        for owner, attr, fn in reversed(undo):
            setattr(owner, attr, fn)


def run_bench(workload: str = "bench-1m", fleet: str = "bench-1000", policies: Sequence[str] = ("jsq", "phaseroute"),
              max_requests: int | None = None, seed: int = 0, log: Callable[[str], None] = print) -> dict[str, Any]:
    t0 = time.perf_counter()
    w, f, info = prepare(workload, fleet, None, seed, max_requests)
    build_s = time.perf_counter() - t0
    doc = {"requests": w.n_requests, "jobs": w.n_jobs, "accelerators": f.accelerators, "pools": len(f.pools),
           "instances": sum(p.instances for p in f.pools), "offered_load": info["offered_load"],
           "workload_build_s": round(build_s, 2), "policies": {}}
    log(f"{w.n_requests} requests, {w.n_jobs} jobs on {f.accelerators} accelerators ({doc['instances']} instances); "
        f"offered load {info['offered_load']}; workload built in {build_s:.1f} s")
    for name in policies:
        driver = make_driver(name)
        with timed_policy() as stats:
            t1 = time.perf_counter()
            sim = Simulator(w, f, driver, SimConfig(seed=seed)).run()
            wall = time.perf_counter() - t1
        done = sum(1 for s in sim.job_state if s is JobState.COMPLETED)
        calls: dict[str, dict[str, Any]] = {
            k: {"calls": v[0], "seconds": round(v[1], 2), "us_per_call": round(1e6 * v[1] / v[0], 1) if v[0] else None}
            for k, v in sorted(stats.items(), key=lambda kv: -kv[1][1]) if v[0]}
        row = {"wall_s": round(wall, 1), "events": sim.counters["events"],
               "events_per_s": round(sim.counters["events"] / wall), "requests_per_s": round(w.n_requests / wall),
               "jobs_done": done, "simulated_s": round(sim.now, 1), "policy_calls": calls}
        if calls:
            top = next(iter(calls))
            row["dominant_policy_call"] = top
            row["policy_share_of_wall"] = round(sum(v["seconds"] for v in calls.values()) / wall, 3)
        doc["policies"][name] = row
        log(f"{name}: {wall:.1f} s wall, {row['events_per_s']} events/s, {row['requests_per_s']} requests/s"
            + (f"; dominant policy call {row['dominant_policy_call']}" if calls else ""))
    return doc
