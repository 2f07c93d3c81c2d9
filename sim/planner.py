"""Capacity planner: which accelerators, how many, at what cost, meet these deadlines.

In the spirit of Melange (Griggs et al., 2024: cheapest mix of GPU types for a workload), but
deadline-aware (the time-indexed LP of ``bound``: every job inside its window) and P/D-aware
(prefill and decode of a job may run on different types, paying KV bytes over the links),
with model placement (one pool per accelerator type and model; how many instances each):

1. For every set of at most ``max_types`` candidate types, the time-indexed LP of ``bound``
   with pool sizes as whole-number variables (a small MILP: only the sizes are integer) gives
   the cheapest fleet of those types whose fluid relaxation serves every job by its deadline.
   No real schedule does better, so this cost is a lower bound for the set: sets are ranked
   by it and only the ``confirm`` cheapest go on.
2. Those fleets are simulated with the chosen policy; while the simulated deadline-miss rate
   exceeds ``target_miss_rate``, the busiest pool (highest utilization) grows by ``growth``
   (at least one instance) and the fleet is simulated again.
3. The cheapest confirmed fleet wins. Its placement says which model each pool holds, how
   many instances, and the prefill/decode split of its busy time in the LP solution.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phaseroute.sim.bound import solve
from phaseroute.sim.bound_model import LPPool, job_work
from phaseroute.sim.bound_result import LPResult
from phaseroute.sim.catalogue import Catalogue, load_catalogue, parse_catalogue
from phaseroute.sim.engine import SimConfig
from phaseroute.sim.errors import SpecError
from phaseroute.sim.fleet import PHASES, parse_fleet
from phaseroute.sim.perfmodel import Efficiency, auto_tp, instance_perf
from phaseroute.sim.runner import run_policy
from phaseroute.sim.specio import Fields, load_spec
from phaseroute.sim.workload import Workload


@dataclass(frozen=True)
class PlanOptions:
    max_types: int = 2
    target_miss_rate: float = 0.01
    confirm: int = 3
    growth: float = 1.15
    max_rounds: int = 8
    intervals: int = 24
    policy: str = "phaseroute"
    seed: int = 0


def load_candidates(ref: str | Path | dict[str, Any] | None) -> tuple[Catalogue, list[str]]:
    """The catalogue and candidate types: ``candidates: [names]`` plus optional ``accelerators``
    entries, or a plain accelerators file (all of its entries are candidates)."""
    base = load_catalogue()
    if ref is None:
        return base, [n for n, a in base.accelerators.items() if not n.startswith("CPU")]
    data, path = load_spec(ref, "catalogue")
    where = str(path or "<catalogue>")
    top = Fields(data, where)
    top.unknown({"candidates", "accelerators", "models"})
    cat = base.merged(parse_catalogue({k: v for k, v in data.items() if k in ("accelerators", "models")}, where))
    names = top.raw("candidates", list((data.get("accelerators") or {}).keys()))
    if not isinstance(names, list) or not names:
        raise SpecError(f"{where}: give a non-empty 'candidates' list or 'accelerators' entries")
    for n in names:
        cat.accelerator(n, f"{where}: candidates: ")
    return cat, names


def _pools(types: tuple[str, ...], models: list[str], cat: Catalogue) -> list[LPPool]:
    pools = []
    for a in types:
        acc = cat.accelerators[a]
        for m in models:
            arch = cat.models[m]
            try:
                tp = auto_tp(acc, arch)
            except ValueError:
                continue
            perf = instance_perf(acc, arch, tp, Efficiency())
            pools.append(LPPool(f"{a}|{m}", a, m, perf, 0.0, PHASES, acc.network_bandwidth, acc.price_per_hour))
    return pools


def _fleet_spec(sizes: dict[str, int], pools: list[LPPool]) -> dict[str, Any]:
    out = []
    for p in pools:
        n = sizes.get(p.name, 0)
        if n > 0:
            out.append({"name": p.name.replace("|", "-").lower(), "accelerator": p.parent, "count": n * p.perf.tp,
                        "models": [p.model], "tp": p.perf.tp})
    return {"name": "planned", "failures": False, "pools": out}


def plan(w: Workload, catalogue: str | Path | dict[str, Any] | None = None, options: PlanOptions = PlanOptions()) -> dict[str, Any]:
    cat, names = load_candidates(catalogue)
    models = sorted({t.model for t in w.tenants})
    for m in models:
        cat.model(m, "workload: ")
    jw = job_work(w)
    lp_rows = []
    for r in range(1, options.max_types + 1):
        for types in itertools.combinations(names, r):
            pools = _pools(types, models, cat)
            if {p.model for p in pools} != set(models):
                continue
            res = solve(jw, pools, options.intervals, size_pools=True, integer_pools=True)
            if res.status != "optimal":
                continue
            lp_rows.append((res.cost_per_hour, types, pools, res))
    lp_rows.sort(key=lambda row: (row[0], row[1]))
    candidates = [{"types": list(t), "lp_cost_per_hour": round(c, 3),
                   "lp_instances": {k: round(v) for k, v in res.instances.items() if v > 0.5}}
                  for c, t, _, res in lp_rows]
    confirmed, seen = [], set()
    for _cost, _types, pools, res in lp_rows:
        used = frozenset((k, round(v)) for k, v in res.instances.items() if v > 0.5)
        if used in seen:            # a larger type set whose solution leaves the extra types empty
            continue
        seen.add(used)
        confirmed.append(_confirm(w, pools, res, options))
        if len(confirmed) >= options.confirm:
            break
    ok = [c for c in confirmed if c["meets_target"]]
    choice = min(ok or confirmed, key=lambda c: c["cost_per_hour"]) if confirmed else None
    return {
        "workload": w.summary(), "options": options.__dict__, "candidates_considered": len(lp_rows),
        "candidates": candidates[:10], "confirmed": confirmed, "choice": choice,
    }


def _confirm(w: Workload, pools: list[LPPool], res: LPResult, options: PlanOptions) -> dict[str, Any]:
    sizes = {p.name: round(res.instances[p.name]) for p in pools if res.instances[p.name] > 0.5}
    rounds = []
    for _ in range(options.max_rounds):
        spec = _fleet_spec(sizes, pools)
        fleet = parse_fleet(spec, "<planned>")
        _, m = run_policy(w, fleet, options.policy, SimConfig(seed=options.seed))
        rounds.append({"instances": dict(sizes), "cost_per_hour": round(fleet.cost_per_hour, 3), "miss_rate": m["miss_rate"],
                       "goodput_tok_s": m["goodput_tok_s"]})
        if m["miss_rate"] <= options.target_miss_rate:
            break
        busiest = max(m["pools"].items(), key=lambda kv: (kv[1]["utilization"], kv[0]))[0]
        for p in pools:
            if p.name in sizes and p.name.replace("|", "-").lower() == busiest:
                sizes[p.name] = max(sizes[p.name] + 1, math.ceil(sizes[p.name] * options.growth))
    last = rounds[-1]
    placement = {}
    for p in pools:
        if p.name in sizes:
            pre, dec = res.pool_prefill_s.get(p.name, 0.0), res.pool_decode_s.get(p.name, 0.0)
            placement[p.name.replace("|", "-").lower()] = {
                "accelerator": p.parent, "model": p.model, "tp": p.perf.tp, "instances": sizes[p.name],
                "accelerators": sizes[p.name] * p.perf.tp, "lp_instances": round(res.instances[p.name], 3),
                "prefill_share_of_busy_time": round(pre / (pre + dec), 3) if pre + dec > 0 else None,
            }
    return {
        "types": sorted({p.parent for p in pools}), "lp_cost_per_hour": round(res.cost_per_hour, 3),
        "cost_per_hour": last["cost_per_hour"], "miss_rate": last["miss_rate"],
        "meets_target": last["miss_rate"] <= options.target_miss_rate, "rounds": rounds,
        "placement": placement, "fleet_spec": _fleet_spec(sizes, pools),
    }
