"""Capacity at SLO: the highest offered load at which a policy's job deadline-miss rate stays <= the SLO.

The figure that separates policies: at 70% load every competent policy meets every deadline,
while the load each can carry before misses start differs by whole multiples. For each policy
and seed, ``find_capacity`` brackets and bisects the offered load (``runner.prepare`` builds
the workload at that load and seed, ``runner.run_policy`` simulates it: every point is a full
simulation, through whatever driver ``runner.make_driver`` returns). Loads are snapped to a
grid and the workloads cached per (seed, load) in ``LoadPoints``, so policies whose searches
pass the same loads share the workload and the bound; later seeds start from the first
seed's capacity. The bound's capacity is the same search on ``bound.miss_rate_bound`` (a
lower bound on any policy's miss rate), so no policy can carry more than it (up to the search
resolution). The search assumes the miss rate grows with load; every point is reported, so a
non-monotone curve shows in the plot.

Headline figures (capacity, goodput per dollar at capacity) are means over the seeds with
their range; the ratios are phaseroute / the best baseline (``drivers.BASELINES``) and
phaseroute / the bound.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from phaseroute.sim.bound import miss_rate_bound
from phaseroute.sim.drivers import BASELINES
from phaseroute.sim.engine import SimConfig
from phaseroute.sim.fleet import Fleet, load_fleet
from phaseroute.sim.runner import make_driver, prepare, run_policy
from phaseroute.sim.workload import Workload, WorkloadSpec, load_workload_spec

Log = Callable[[str], None]


@dataclass(frozen=True)
class CapacityOptions:
    slo: float = 0.02            # largest job deadline-miss rate accepted
    seeds: tuple[int, ...] = (0, 1, 2)
    start: float = 1.0           # first load tried (fraction of the fleet's fluid capacity)
    step: float = 1.5            # bracketing factor of the first seed's search
    refine_step: float = 1.1     # bracketing factor of later seeds (they start at the first seed's capacity)
    tolerance: float = 0.05      # stop when the bracket [lo, hi] has hi / lo - 1 <= this
    min_load: float = 0.1
    max_load: float = 4.0
    grid: float = 0.01           # loads are multiples of this, so searches meet on the same points
    bound: bool = True
    bound_max_load: float = 8.0  # the bound's search goes this high (it carries far more than any policy)
    max_requests: int | None = None

    def __post_init__(self) -> None:
        checks = [
            ("slo", 0.0 <= self.slo < 1.0, "in [0, 1)"), ("seeds", len(self.seeds) >= 1, "at least one seed"),
            ("step", self.step > 1.0, "> 1"), ("refine_step", self.refine_step > 1.0, "> 1"),
            ("tolerance", self.tolerance > 0.0, "> 0"), ("grid", self.grid > 0.0, "> 0"),
            ("min_load", 0.0 < self.min_load < self.max_load, "> 0 and < max_load"),
            ("start", self.min_load <= self.start <= self.max_load, "within [min_load, max_load]"),
            ("bound_max_load", self.bound_max_load >= self.max_load, ">= max_load"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"capacity option {name} must be {rule}, got {getattr(self, name)!r}")


class LoadPoints:
    """The workload (and fleet) at each (seed, load), built once for every policy and the bound."""

    def __init__(self, workload: WorkloadSpec | str | Path | dict[str, Any], fleet: Fleet | str | Path | dict[str, Any],
                 max_requests: int | None = None):
        self.spec = workload if isinstance(workload, WorkloadSpec) else load_workload_spec(workload)
        self.fleet = fleet if isinstance(fleet, Fleet) else load_fleet(fleet)
        self.max_requests = max_requests
        self._cache: dict[tuple[int, float], tuple[Workload, Fleet, dict[str, Any]]] = {}

    def get(self, seed: int, load: float) -> tuple[Workload, Fleet, dict[str, Any]]:
        key = (seed, load)
        if key not in self._cache:
            self._cache[key] = prepare(self.spec, self.fleet, load, seed, self.max_requests)
        return self._cache[key]


@dataclass
class Search:
    """One capacity search: the capacity (None below ``min_load``), how it ended, every point tried."""

    capacity: float | None
    status: str                  # found | at_max (passes at max_load) | below_min (fails at min_load)
    points: list[dict[str, Any]] = field(default_factory=list)


def find_capacity(measure: Callable[[float], dict[str, Any]], slo: float, start: float, step: float,
                  opts: CapacityOptions, key: str = "miss_rate") -> Search:
    """Bracket then bisect (geometric midpoints) the highest load whose ``measure(load)[key]``
    is <= ``slo``; ``measure`` returns the point's figures (kept in ``points``). The bracketing
    factor squares after each step (1.1, 1.21, 1.46, ...)."""
    search = Search(None, "found")

    def snap(x: float) -> float:
        return round(min(max(round(x / opts.grid) * opts.grid, opts.min_load), opts.max_load), 10)

    def passes(load: float) -> bool:
        point = {"load": load, **measure(load)}
        search.points.append(point)
        ok: bool = point[key] <= slo
        return ok

    lo: float | None = None
    hi: float | None = None
    load = snap(start)
    if passes(load):
        lo = load
        while hi is None:
            if lo >= opts.max_load:
                search.capacity, search.status = lo, "at_max"
                return search
            nxt = snap(lo * step)
            lo, hi = (nxt, None) if passes(nxt) else (lo, nxt)
            step *= step            # a bracket far from the start is reached in a few points
    else:
        hi = load
        while lo is None:
            if hi <= opts.min_load:
                search.status = "below_min"
                return search
            nxt = snap(hi / step)
            lo, hi = (nxt, hi) if passes(nxt) else (None, nxt)
            step *= step
    while hi / lo - 1.0 > opts.tolerance:
        mid = snap(math.sqrt(lo * hi))
        if mid <= lo or mid >= hi:
            break
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    search.capacity = lo
    return search


_POINT_FIGURES = ("miss_rate", "goodput_tok_s", "goodput_tokens_per_dollar", "cost_usd", "transfer_cost_usd",
                  "kv_bytes_per_delivered_token", "colocated_share", "jobs", "jobs_infeasible", "wall_s")


def _policy_point(points: LoadPoints, name: str, seed: int) -> Callable[[float], dict[str, Any]]:
    """The figures of policy ``name`` at a load, for one seed."""
    def measure(load: float) -> dict[str, Any]:
        w, f, _ = points.get(seed, load)
        _, m = run_policy(w, f, name, SimConfig(seed=seed))
        return {k: m.get(k) for k in _POINT_FIGURES}
    return measure


def _bound_point(points: LoadPoints, seed: int) -> Callable[[float], dict[str, Any]]:
    def measure(load: float) -> dict[str, Any]:
        w, f, _ = points.get(seed, load)
        b = miss_rate_bound(w, f)
        return {"miss_rate": round(b["miss_rate_lower_bound"], 6), "status": b["status"], "solve_s": b["solve_s"]}
    return measure


def spread(values: list[float]) -> dict[str, Any]:
    """Mean and range of the per-seed figures."""
    return {"mean": round(statistics.fmean(values), 4), "min": round(min(values), 4), "max": round(max(values), 4),
            "per_seed": [round(v, 4) for v in values]}


def _at_capacity(search: Search, key: str) -> float | None:
    hits = [p[key] for p in search.points if p["load"] == search.capacity and p.get(key) is not None]
    return float(hits[-1]) if hits else None


def _searches(measure_of: Callable[[int], Callable[[float], dict[str, Any]]], opts: CapacityOptions, label: str,
              log: Log) -> list[Search]:
    out: list[Search] = []
    for k, seed in enumerate(opts.seeds):
        start = out[0].capacity if k and out[0].capacity else opts.start
        step = opts.refine_step if k and out[0].capacity else opts.step
        t0 = time.perf_counter()
        s = find_capacity(measure_of(seed), opts.slo, start, step, opts)
        out.append(s)
        log(f"{label} seed {seed}: capacity {s.capacity} ({s.status}) after {len(s.points)} points, "
            f"{time.perf_counter() - t0:.0f} s")
    return out


def _summary(searches: list[Search], opts: CapacityOptions, with_money: bool) -> dict[str, Any]:
    caps = [s.capacity if s.capacity is not None else 0.0 for s in searches]
    doc: dict[str, Any] = {"capacity": spread(caps), "status": [s.status for s in searches],
                 "points": {str(seed): s.points for seed, s in zip(opts.seeds, searches, strict=True)},
                 "points_simulated": sum(len(s.points) for s in searches)}
    if with_money:
        for key in ("goodput_tokens_per_dollar", "goodput_tok_s"):
            vals = [_at_capacity(s, key) for s in searches]
            doc[f"{key}_at_capacity"] = spread([v for v in vals if v is not None]) if any(
                v is not None for v in vals) else None
    return doc


def _ratio(num: list[float], den: list[float]) -> dict[str, Any] | None:
    pairs = [(a, b) for a, b in zip(num, den, strict=True) if b > 0]
    if not pairs:
        return None
    per_seed = [a / b for a, b in pairs]
    of_means = statistics.fmean(a for a, _ in pairs) / statistics.fmean(b for _, b in pairs)
    return {"of_means": round(of_means, 4), **{k: v for k, v in spread(per_seed).items() if k != "mean"},
            "mean_of_seeds": round(statistics.fmean(per_seed), 4)}


def capacity_study(workload: WorkloadSpec | str | Path | dict[str, Any], fleet: Fleet | str | Path | dict[str, Any],
                   policies: list[str], opts: CapacityOptions = CapacityOptions(), log: Log = lambda _m: None) -> dict[str, Any]:
    """Capacity at SLO of each policy (and the bound), over the seeds, as one JSON-ready document."""
    t0 = time.perf_counter()
    points = LoadPoints(workload, fleet, opts.max_requests)
    doc: dict[str, Any] = {"workload": points.spec.name, "fleet": points.fleet.name, "slo": opts.slo,
                 "options": {k: v for k, v in asdict(opts).items() if k != "bound"},
                 "drivers": {n: type(make_driver(n)).__module__ for n in policies}, "policies": {}}
    for name in policies:
        searches = _searches(functools.partial(_policy_point, points, name), opts, name, log)
        doc["policies"][name] = _summary(searches, opts, with_money=True)
    if opts.bound:
        bound_opts = replace(opts, max_load=opts.bound_max_load)
        doc["bound"] = _summary(_searches(functools.partial(_bound_point, points), bound_opts, "bound", log),
                                bound_opts, False)
    doc["ratios"] = _ratios(doc, opts)
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    return doc


def _ratios(doc: dict[str, Any], opts: CapacityOptions) -> dict[str, Any]:
    pol = doc["policies"]
    out: dict[str, Any] = {}
    if "phaseroute" not in pol:
        return out
    mine = pol["phaseroute"]["capacity"]["per_seed"]
    baselines = [n for n in pol if n in BASELINES]
    if baselines:
        best = max(baselines, key=lambda n: (pol[n]["capacity"]["mean"], n))
        per_seed_best = [max(pol[n]["capacity"]["per_seed"][k] for n in baselines) for k in range(len(opts.seeds))]
        out["phaseroute_vs_best_baseline"] = {"best_baseline": best, **(_ratio(mine, per_seed_best) or {})}
    if "bound" in doc:
        out["phaseroute_vs_bound"] = _ratio(mine, doc["bound"]["capacity"]["per_seed"])
    return out
