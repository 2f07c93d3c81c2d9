"""Upper bound: a time-indexed linear-programming (fluid) relaxation of deadline-met goodput.

Time [0, last deadline] is cut into intervals. Variable x[j, p, t] is the fraction of job j
served during interval t by placement p = (prefill pool a, decode pool b); a == b means
colocated, a != b moves the job's KV over link (a, b). Job j may only use intervals that
overlap [submit, deadline] (windows are widened to the grid, which loosens the bound, never
tightens it). Maximize the tokens of served job fractions subject to, per pool and interval:

    compute:  sum slowdown x (prefill FLOPs / F + decode FLOPs / F_dec) + decode steps x overhead <= instances x dt x alive
    memory:   sum slowdown x decode bytes / B + decode steps x overhead                   <= instances x dt x alive
    KV time:  sum KV bytes held x seconds (each decode token holds its context's KV for at
              least one step, which lasts at least slowdown x W / B + overhead)            <= instances x dt x alive x KV capacity
    link:     sum KV bytes of disaggregated fractions                                     <= link bandwidth x dt

Every engine step takes at least its FLOPs / F and at least its bytes / B, so these sums are
lower bounds of the busy time the simulator charges (decode weight reads are amortized over
the largest batch memory allows; prefill before decode and all queueing are ignored; random
failures are ignored). Hence the optimum bounds the deadline-met tokens of ANY policy on the
same performance model: the bound is on what the fleet could do, not on what a policy does.

The same builder, with pool sizes as variables and cost as objective, is the capacity
planner's relaxation (``solve_min_cost``), and with one interval and no deadlines it gives the
fleet's maximum throughput for the workload's mix (``max_throughput``), which defines
offered load.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import coo_matrix, csr_matrix

from phaseroute.sim.fleet import Fleet
from phaseroute.sim.perfmodel import InstancePerf
from phaseroute.sim.workload import Workload


@dataclass(frozen=True)
class JobWork:
    """Per-job sums the costs are linear in (one row per job or job class)."""

    model: list[str]
    release: np.ndarray
    deadline: np.ndarray
    tokens: np.ndarray      # prompt + output
    prompt: np.ndarray      # sum L
    prompt_sq: np.ndarray   # sum L^2
    output: np.ndarray      # sum O
    ctx_out: np.ndarray     # sum O (L + O / 2): decode tokens x their mean context
    min_ctx: float          # smallest context of any request (caps the feasible batch)
    requests: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None   # (row of its job, L, O) per request


def job_work(w: Workload) -> JobWork:
    L = w.req_prompt.astype(np.float64)
    O = w.req_output.astype(np.float64)
    sums = lambda v: np.add.reduceat(v, w.job_first)  # noqa: E731
    return JobWork(
        model=w.job_model(), release=w.job_submit.copy(), deadline=w.job_deadline.copy(),
        tokens=sums(L + O), prompt=sums(L), prompt_sq=sums(L * L), output=sums(O),
        ctx_out=sums(O * (L + O / 2)), min_ctx=float(L.min() + 1) if len(L) else 1.0,
        requests=(w.req_job.astype(np.int64), L, O),
    )


def aggregate_by_model(jw: JobWork, start: float, end: float) -> JobWork:
    """One class per model holding all its jobs, released at ``start`` and due at ``end``."""
    models = sorted(set(jw.model))
    pick = lambda v: np.array([v[[i for i, m in enumerate(jw.model) if m == mm]].sum() for mm in models])  # noqa: E731
    n = len(models)
    requests = None
    if jw.requests is not None:
        group = np.array([models.index(m) for m in jw.model], dtype=np.int64)[jw.requests[0]]
        requests = (group, jw.requests[1], jw.requests[2])
    return JobWork(models, np.full(n, start), np.full(n, end), pick(jw.tokens), pick(jw.prompt), pick(jw.prompt_sq),
                   pick(jw.output), pick(jw.ctx_out), jw.min_ctx, requests)


@dataclass(frozen=True)
class LPPool:
    name: str
    parent: str
    model: str
    perf: InstancePerf
    instances: float
    phases: tuple[str, ...]
    nic: float             # bytes/s per accelerator
    price_per_hour: float  # per accelerator


def lp_pools(fleet: Fleet) -> list[LPPool]:
    return [LPPool(p.name, p.parent, p.model, p.perf, float(p.instances), p.phases, p.accelerator.network_bandwidth,
                   p.price_per_hour) for p in fleet.pools]


def _kv_time(jw: JobWork, p: LPPool) -> tuple[np.ndarray, np.ndarray]:
    """Per job on pool p: KV byte-seconds held by its decode tokens, split into the part that
    scales with slowdown (weight reads) and the fixed per-step overhead part."""
    f = p.perf
    held = f.kv_per_token * jw.ctx_out
    return held * f.weight_bytes / f.bandwidth, held * f.overhead


def _costs(jw: JobWork, p: LPPool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Seconds of one instance of pool p per job: prefill compute, decode compute, decode memory, decode overhead."""
    f = p.perf
    fit = f.kv_capacity / (f.kv_per_token * jw.min_ctx) if f.kv_per_token > 0 else float(f.max_batch)
    batch = max(1.0, min(f.max_batch, math.floor(fit)))
    pre = (f.two_p * jw.prompt + f.pre_attn * jw.prompt_sq) / f.flops
    dec_c = (f.two_p * jw.output + f.dec_attn * jw.ctx_out) / f.flops_decode
    dec_m = (f.weight_bytes * jw.output / batch + f.kv_per_token * jw.ctx_out) / f.bandwidth
    over = f.overhead * jw.output / batch
    return pre, dec_c, dec_m, over


def _timeline(fleet: Fleet | None, parent: str, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per interval: fraction of time the pool is alive, and the smallest slowdown while alive."""
    n = len(edges) - 1
    alive, slow = np.ones(n), np.ones(n)
    if fleet is None:
        return alive, slow
    changes = [(0.0, True, 1.0)]
    state_alive, state_slow = True, 1.0
    for e in fleet.events:
        if e.pool != parent:
            continue
        if e.kind == "loss":
            state_alive = False
        elif e.kind == "restore":
            state_alive, state_slow = True, 1.0
        else:
            state_slow = e.factor
        changes.append((e.at_s, state_alive, state_slow))
    changes.append((float("inf"), state_alive, state_slow))
    for t in range(n):
        a, b = edges[t], edges[t + 1]
        up, factors = 0.0, []
        for (s0, al, sl), (s1, _, _) in zip(changes[:-1], changes[1:]):
            lo, hi = max(a, s0), min(b, s1)
            if hi > lo and al:
                up += hi - lo
                factors.append(sl)
        alive[t] = up / (b - a)
        slow[t] = min(factors) if factors else 1.0
    return alive, slow


@dataclass
class LPResult:
    status: str
    objective_tokens: float          # tokens of served job fractions
    cost_per_hour: float             # fleet cost of the solution's pool sizes
    job_fraction: np.ndarray
    pool_prefill_s: dict[str, float]  # instance-seconds of prefill per pool
    pool_decode_s: dict[str, float]
    instances: dict[str, float]
    kv_bytes: float
    variables: int
    solve_s: float


class _Rows:
    """Sparse constraint rows A x <= b, allocated in named blocks."""

    def __init__(self) -> None:
        self.n = 0
        self.r: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.b: list[np.ndarray] = []

    def block(self, rhs: np.ndarray) -> int:
        start = self.n
        self.b.append(np.asarray(rhs, dtype=np.float64).ravel())
        self.n += len(self.b[-1])
        return start

    def add(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> None:
        self.r.append(np.asarray(rows, np.int64))
        self.c.append(np.asarray(cols, np.int64))
        self.v.append(np.asarray(vals, np.float64))

    def matrix(self, n_cols: int) -> tuple[csr_matrix, np.ndarray]:
        A = coo_matrix((np.concatenate(self.v), (np.concatenate(self.r), np.concatenate(self.c))),
                       shape=(self.n, n_cols)).tocsr()
        return A, np.concatenate(self.b)


def _placements(jw: JobWork, pools: list[LPPool]) -> dict[str, list[tuple[int, int]]]:
    out = {}
    for m in set(jw.model):
        idx = [i for i, p in enumerate(pools) if p.model == m]
        out[m] = [(a, b) for a in idx for b in idx
                  if "prefill" in pools[a].phases and "decode" in pools[b].phases
                  and (a != b or set(pools[a].phases) == {"prefill", "decode"})]
    return out


def _variables(jw: JobWork, placements: dict[str, list[tuple[int, int]]], dt: float, T: int):
    """(job, prefill pool, decode pool, interval) of every variable."""
    parts = []
    for j in range(len(jw.tokens)):
        t0 = min(int(np.floor(jw.release[j] / dt)), T - 1)
        t1 = min(max(int(np.ceil(jw.deadline[j] / dt)), t0 + 1), T)
        ts = np.arange(t0, t1)
        for a, b in placements[jw.model[j]]:
            parts.append(np.stack([np.full(len(ts), j), np.full(len(ts), a), np.full(len(ts), b), ts]))
    if not parts:
        return (np.zeros(0, np.int64),) * 4
    v = np.concatenate(parts, axis=1).astype(np.int64)
    return v[0], v[1], v[2], v[3]


def _pool_sets(n: int) -> list[tuple[int, ...]]:
    """The sets of pools fit rows are written for: every non-empty set on small fleets, else
    each pool alone and each pool left out (the sets a lost pool leaves behind)."""
    if n <= 8:
        return [c for k in range(1, n + 1) for c in itertools.combinations(range(n), k)]
    return [(i,) for i in range(n)] + [tuple(k for k in range(n) if k != i) for i in range(n)]


def _fit_rows(rows: _Rows, jw: JobWork, pools: list[LPPool], va, vb, vj) -> None:
    """The pools of a set S together serve at most the share of a job's tokens whose requests
    fit an instance of some pool in S (prompt + output in KV for decode or colocated, the prompt
    for prefill). One pool alone is the plain fit; a set matters when a pool that alone holds
    the largest requests is lost: the others cannot take those requests' tokens between them."""
    if jw.requests is None:
        return
    group, L, O = jw.requests
    J = len(jw.tokens)
    decode_fit = np.stack([(L + O) * p.perf.kv_per_token <= p.perf.kv_capacity for p in pools])
    prefill_fit = np.stack([L * p.perf.kv_per_token <= p.perf.kv_capacity for p in pools])
    for pool_set in _pool_sets(len(pools)):
        members = np.array(pool_set)
        for fit, var_pool in ((decode_fit, vb), (prefill_fit, va)):
            fits_any = fit[members].any(axis=0)
            share = np.bincount(group, weights=(L + O) * fits_any, minlength=J) / np.maximum(jw.tokens, 1e-12)
            if (share >= 1 - 1e-12).all():
                continue
            r0 = rows.block(np.minimum(share, 1.0))
            sel = np.flatnonzero(np.isin(var_pool, members))
            rows.add(r0 + vj[sel], sel, np.ones(len(sel)))


def solve(jw: JobWork, pools: list[LPPool], n_intervals: int = 48, fleet: Fleet | None = None,
          links: dict[tuple[str, str], float] | None = None, horizon: float | None = None,
          size_pools: bool = False, min_token_fraction: float = 1.0, integer_pools: bool = False) -> LPResult:
    """Maximize served tokens on fixed pools; or, with ``size_pools``, make each pool's instance
    count a variable and minimize fleet cost while serving ``min_token_fraction`` of the tokens
    (link bandwidth then scales with the accelerators at both ends); ``integer_pools`` makes
    the instance counts whole numbers (a small MILP: only the pool sizes are integer)."""
    t_start = time.perf_counter()
    T = n_intervals
    end = horizon or float(jw.deadline.max())
    dt = end / T
    P, J = len(pools), len(jw.tokens)
    edges = np.linspace(0.0, end, T + 1)
    alive, slow = (np.array(x) for x in zip(*[_timeline(fleet, p.parent, edges) for p in pools]))
    pre, dec_c, dec_m, over = (np.array(x) for x in zip(*[_costs(jw, p) for p in pools]))   # P x J each
    placements = _placements(jw, pools)
    vj, va, vb, vt = _variables(jw, placements, dt, T)
    nx = len(vj)
    n_cols = nx + (P if size_pools else 0)
    inst = np.array([p.instances for p in pools])
    rows = _Rows()
    r_job = rows.block(np.ones(J))
    rows.add(r_job + vj, np.arange(nx), np.ones(nx))
    cap = alive * dt                                       # seconds per instance, P x T
    for cost_b in (dec_c, dec_m):                          # compute rows, then memory rows
        r0 = rows.block(np.zeros(P * T) if size_pools else cap * inst[:, None])
        if cost_b is dec_c:
            rows.add(r0 + va * T + vt, np.arange(nx), pre[va, vj] * slow[va, vt])
        rows.add(r0 + vb * T + vt, np.arange(nx), cost_b[vb, vj] * slow[vb, vt] + over[vb, vj])
        if size_pools:
            for i in range(P):
                rows.add(r0 + i * T + np.arange(T), np.full(T, nx + i), -cap[i])
    kvt_slow, kvt_fixed = (np.array(x) for x in zip(*[_kv_time(jw, p) for p in pools]))   # P x J each
    kv_cap = np.array([p.perf.kv_capacity for p in pools])
    r0 = rows.block(np.zeros(P * T) if size_pools else (cap * inst[:, None] * kv_cap[:, None]))
    rows.add(r0 + vb * T + vt, np.arange(nx), kvt_slow[vb, vj] * slow[vb, vt] + kvt_fixed[vb, vj])
    if size_pools:
        for i in range(P):
            rows.add(r0 + i * T + np.arange(T), np.full(T, nx + i), -cap[i] * kv_cap[i])
    kv = {m: next(p.perf.kv_per_token for p in pools if p.model == m) for m in placements}
    _fit_rows(rows, jw, pools, va, vb, vj)
    kv_bytes = np.array([kv[jw.model[j]] for j in range(J)]) * jw.prompt
    dis = np.flatnonzero(va != vb)
    parents = sorted({p.parent for p in pools})
    pair = np.array([parents.index(pools[a].parent) * len(parents) + parents.index(pools[b].parent)
                     for a, b in zip(va[dis], vb[dis])], dtype=np.int64)
    for key in np.unique(pair):
        src, dst = parents[key // len(parents)], parents[key % len(parents)]
        sel = dis[pair == key]
        ends = (src, dst) if size_pools else (None,)
        for end_parent in ends:
            bw = 0.0 if size_pools else (links or {}).get((src, dst), 0.0)
            r0 = rows.block(np.full(T, bw * dt))
            rows.add(r0 + vt[sel], sel, kv_bytes[vj[sel]])
            for i, p in enumerate(pools):
                if size_pools and p.parent == end_parent:
                    rows.add(r0 + np.arange(T), np.full(T, nx + i), -np.full(T, p.perf.tp * p.nic * dt))
    tok = jw.tokens[vj]
    price = np.array([p.price_per_hour * p.perf.tp for p in pools])
    if size_pools:
        r0 = rows.block([-min_token_fraction * jw.tokens.sum()])
        rows.add(np.full(nx, r0), np.arange(nx), -tok)
        c = np.concatenate([np.zeros(nx), price])
    else:
        c = -tok
    A, b = rows.matrix(n_cols)
    if size_pools and integer_pools:
        integrality = np.concatenate([np.zeros(nx), np.ones(P)])
        res = milp(c, constraints=LinearConstraint(A, -np.inf, b), bounds=Bounds(0, np.inf), integrality=integrality)
    else:
        res = linprog(c, A_ub=A, b_ub=b, bounds=(0, None), method="highs")
    if res.x is None:
        return LPResult(str(res.message), 0.0, float("inf"), np.zeros(J), {}, {}, {}, 0.0, nx,
                        time.perf_counter() - t_start)
    x = res.x[:nx]
    sizes = res.x[nx:] if size_pools else inst
    return LPResult(
        status="optimal" if res.status == 0 else str(res.message),
        objective_tokens=float((x * tok).sum()), cost_per_hour=float((sizes * price).sum()),
        job_fraction=np.bincount(vj, weights=x, minlength=J),
        pool_prefill_s={p.name: float((x * pre[va, vj])[va == i].sum()) for i, p in enumerate(pools)},
        pool_decode_s={p.name: float((x * np.maximum(dec_c[vb, vj], dec_m[vb, vj]))[vb == i].sum())
                       for i, p in enumerate(pools)},
        instances={p.name: float(sizes[i]) for i, p in enumerate(pools)},
        kv_bytes=float((x[dis] * kv_bytes[vj[dis]]).sum()), variables=nx, solve_s=time.perf_counter() - t_start,
    )


def fleet_links(fleet: Fleet) -> dict[tuple[str, str], float]:
    return {k: v.bandwidth for k, v in fleet.links.items()}


def default_intervals(w: Workload, per_window: int = 3, lo: int = 48, hi: int = 400) -> int:
    """Enough intervals that the shortest job window spans ``per_window`` of them (widening a
    window to the grid loosens the bound by at most two intervals), within [lo, hi]."""
    if not w.n_jobs:
        return lo
    shortest = float((w.job_deadline - w.job_submit).min())
    return int(min(max(lo, math.ceil(per_window * float(w.job_deadline.max()) / max(shortest, 1e-9))), hi))


def deadline_bound(w: Workload, fleet: Fleet, n_intervals: int | None = None) -> dict:
    """The bound on deadline-met goodput of this workload on this fleet (events included)."""
    n_intervals = n_intervals or default_intervals(w)
    res = solve(job_work(w), lp_pools(fleet), n_intervals, fleet, fleet_links(fleet))
    return {
        "status": res.status, "goodput_tok_s": res.objective_tokens / w.span_s,
        "deadline_met_tokens": res.objective_tokens, "jobs_fully_served": int((res.job_fraction > 1 - 1e-6).sum()),
        "job_fraction_mean": float(res.job_fraction.mean()) if len(res.job_fraction) else 0.0,
        "kv_bytes_moved": res.kv_bytes, "variables": res.variables, "intervals": n_intervals,
        "solve_s": round(res.solve_s, 3),
    }


def max_throughput(w: Workload, fleet: Fleet) -> float:
    """Tokens/s the fleet sustains on this workload's mix (fluid, no deadlines, no events).

    One interval of 1 s: the largest k such that k x (the whole workload) fits, by bisection."""
    jw = aggregate_by_model(job_work(w), 0.0, 1.0)
    pools, links = lp_pools(fleet), fleet_links(fleet)
    fits = lambda k: solve(_scaled(jw, k), pools, 1, None, links, 1.0).job_fraction.min() >= 1 - 1e-7  # noqa: E731
    lo, hi = 0.0, 1e-3
    while fits(hi):
        lo, hi = hi, hi * 4
    while hi - lo > 1e-3 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo * float(jw.tokens.sum())


def _scaled(jw: JobWork, k: float) -> JobWork:
    return JobWork(jw.model, jw.release, jw.deadline, jw.tokens * k, jw.prompt * k, jw.prompt_sq * k, jw.output * k,
                   jw.ctx_out * k, jw.min_ctx, jw.requests)


def offered_load(w: Workload, fleet: Fleet) -> float:
    tokens = float((w.req_prompt + w.req_output).sum())
    return tokens / w.span_s / max_throughput(w, fleet)
