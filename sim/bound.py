"""Upper bound: a time-indexed linear-programming (fluid) relaxation of deadline-met goodput.

The LP (columns and rows: ``bound_model`` and ``bound_rows``) maximizes the tokens of job
fractions served within their windows under per pool and interval compute, memory-bandwidth
and KV-memory-time capacity, per link bandwidth, and the fit of requests to instances.

Why it bounds every policy: every engine step takes at least its FLOPs / F and at least its
bytes / B, so the rows' sums are lower bounds of the busy time the simulator charges (decode
weight reads are amortized over the largest batch memory allows; prefill before decode and
all queueing are ignored; random failures are ignored). A policy's run, read as "the share of
each met job done in each interval on each placement", satisfies every row, so its
deadline-met tokens are at most the LP optimum: the bound is on what the fleet could do, not
on what a policy does. Jobs with a request no pool can serve have no column (no policy meets
them, ``limits``).

Two modelling simplifications are approximations rather than strict relaxations, and the
tests check on simulated runs that no policy beats the bound: a column is a uniform slice of
its job (a policy that sends a job's prompt-heavy requests to one pool and its output-heavy
ones to another is represented only through the job's mean mix), and a slice's prefill and
decode are charged to the same interval (a request's decode may start in the next one).

Solving it at scale (``deadline_bound``): column generation (``bound_colgen``) solves the same
LP and reports a dual bound that stays an upper bound even if it stops early. The exact
solve here (``solve``) passes every column to HiGHS at once: it is what the tests compare
against on small cases, and, with pool sizes as variables and cost as objective, the
capacity planner's relaxation; with one interval and no deadlines it gives the fleet's
maximum throughput for the workload's mix (``max_throughput``), which defines offered load.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp

from phaseroute.sim.bound_colgen import solve_colgen
from phaseroute.sim.bound_model import (
    JobWork,
    LPPool,
    aggregate_by_model,
    build_model,
    infeasible_job_rows,
    job_work,
    lp_pools,
)
from phaseroute.sim.bound_result import LPResult, summarize
from phaseroute.sim.bound_rows import assemble
from phaseroute.sim.fleet import Fleet
from phaseroute.sim.solver_io import quiet_solver
from phaseroute.sim.workload import Workload

METHODS = ("colgen", "exact")


def solve(jw: JobWork, pools: list[LPPool], n_intervals: int = 48, fleet: Fleet | None = None,
          links: dict[tuple[str, str], float] | None = None, horizon: float | None = None,
          size_pools: bool = False, min_token_fraction: float = 1.0, integer_pools: bool = False) -> LPResult:
    """The exact LP: maximize served tokens on fixed pools; or, with ``size_pools``, make each
    pool's instance count a variable and minimize fleet cost while serving
    ``min_token_fraction`` of the tokens (link bandwidth then scales with the accelerators at
    both ends); ``integer_pools`` makes the instance counts whole numbers (a small MILP: only
    the pool sizes are integer)."""
    t_start = time.perf_counter()
    m = build_model(jw, pools, n_intervals, fleet, links, horizon)
    A, b, c = assemble(m, size_pools, min_token_fraction)
    nx, P = m.n_columns, len(pools)
    if nx == 0 and not size_pools:      # no job any pool can serve
        return summarize(m, np.zeros(0), np.array([p.instances for p in pools]), "optimal", t_start)
    with quiet_solver() as log:
        if size_pools and integer_pools:
            integrality = np.concatenate([np.zeros(nx), np.ones(P)])
            res = milp(-c, constraints=LinearConstraint(A, -np.inf, b), bounds=Bounds(0, np.inf),
                       integrality=integrality)
        else:
            res = linprog(-c, A_ub=A, b_ub=b, bounds=(0, None), method="highs")
    if res.x is None:
        message = f"{res.message} (solver: {log.tail()})" if log.text.strip() else str(res.message)
        return LPResult(message, 0.0, float("inf"), np.zeros(len(jw.tokens)), {}, {}, {}, 0.0, nx,
                        time.perf_counter() - t_start)
    sizes = res.x[nx:] if size_pools else np.array([p.instances for p in pools])
    return summarize(m, res.x[:nx], sizes, "optimal" if res.status == 0 else str(res.message), t_start,
                     columns_used=nx)


def fleet_links(fleet: Fleet) -> dict[tuple[str, str], float]:
    return {k: v.bandwidth for k, v in fleet.links.items()}


def default_intervals(w: Workload, per_window: int = 3, lo: int = 48, hi: int = 400) -> int:
    """Enough intervals that the shortest job window spans ``per_window`` of them (widening a
    window to the grid loosens the bound by at most two intervals), within [lo, hi]."""
    if not w.n_jobs:
        return lo
    shortest = float((w.job_deadline - w.job_submit).min())
    return int(min(max(lo, math.ceil(per_window * float(w.job_deadline.max()) / max(shortest, 1e-9))), hi))


def deadline_bound(w: Workload, fleet: Fleet, n_intervals: int | None = None, method: str = "colgen") -> dict[str, Any]:
    """The bound on deadline-met goodput of this workload on this fleet (events included).

    ``colgen`` (default) reports the dual bound of column generation, an upper bound even when
    it stops at its round or time limit; ``exact`` hands the whole LP to HiGHS (slow beyond a
    few hundred jobs)."""
    if method not in METHODS:
        raise ValueError(f"bound method must be one of {list(METHODS)}, got {method!r}")
    n_intervals = n_intervals or default_intervals(w)
    jw, pools, links = job_work(w), lp_pools(fleet), fleet_links(fleet)
    if method == "colgen":
        res = solve_colgen(build_model(jw, pools, n_intervals, fleet, links))
        tokens = res.upper_bound
    else:
        res = solve(jw, pools, n_intervals, fleet, links)
        tokens = res.objective_tokens
    excluded = int(infeasible_job_rows(jw, pools).sum())
    return {
        "status": res.status, "method": method, "goodput_tok_s": tokens / w.span_s, "deadline_met_tokens": tokens,
        "primal_tokens": res.objective_tokens,
        "gap": round((tokens - res.objective_tokens) / tokens, 6) if tokens > 0 else 0.0,
        "jobs_fully_served": int((res.job_fraction > 1 - 1e-6).sum()),
        "job_fraction_mean": float(res.job_fraction.mean()) if len(res.job_fraction) else 0.0,
        "jobs_infeasible": excluded, "kv_bytes_moved": res.kv_bytes, "variables": res.variables,
        "columns_used": res.columns_used, "rounds": res.rounds, "intervals": n_intervals,
        "solve_s": round(res.solve_s, 3),
    }


def miss_rate_bound(w: Workload, fleet: Fleet, n_intervals: int | None = None) -> dict[str, Any]:
    """A lower bound on the job deadline-miss rate of ANY policy: 1 - (the LP's largest sum of
    served job fractions) / jobs. A policy meeting k jobs is a feasible LP point whose
    fractions add up to k, so no policy misses fewer than this (jobs no pool can serve count
    as misses: they have no column)."""
    n_intervals = n_intervals or default_intervals(w)
    res = solve_colgen(build_model(job_work(w), lp_pools(fleet), n_intervals, fleet, fleet_links(fleet)),
                       objective="jobs")
    met = min(res.upper_bound, float(w.n_jobs))
    return {"status": res.status, "miss_rate_lower_bound": 1.0 - met / max(w.n_jobs, 1), "jobs": w.n_jobs,
            "jobs_met_upper_bound": met, "rounds": res.rounds, "intervals": n_intervals,
            "solve_s": round(res.solve_s, 3)}


def max_throughput(w: Workload, fleet: Fleet) -> float:
    """Tokens/s the fleet sustains on this workload's mix (fluid, no deadlines, no events; jobs
    no pool can serve left out).

    One interval of 1 s: the largest k such that k x (the whole workload) fits, by bisection."""
    pools, links = lp_pools(fleet), fleet_links(fleet)
    per_job = job_work(w)
    feasible = ~infeasible_job_rows(per_job, pools)
    if not feasible.any():
        return 0.0
    jw = aggregate_by_model(per_job.subset(feasible), 0.0, 1.0)

    def fits(k: float) -> bool:
        return bool(solve(jw.scaled(k), pools, 1, None, links, 1.0).job_fraction.min() >= 1 - 1e-7)

    lo, hi = 0.0, 1e-3
    while fits(hi):
        lo, hi = hi, hi * 4
    while hi - lo > 1e-3 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo * float(jw.tokens.sum())


def offered_load(w: Workload, fleet: Fleet) -> float:
    tokens = float((w.req_prompt + w.req_output).sum())
    return tokens / w.span_s / max_throughput(w, fleet)
