"""The LP bound's data: what each column (a share of one job, on one placement, in one interval) costs.

Time [0, horizon] is cut into ``T`` equal intervals. Column (j, a, b, t) is the fraction of
job j served during interval t with prefill on pool a and decode on pool b (a == b:
colocated; a != b moves the job's KV over link (a, b)); job j has columns only in the
intervals that overlap [submit, deadline] (windows widened to the grid, which loosens the
bound, never tightens it). ``assemble`` writes the rows, per pool and interval:

    compute:  sum slowdown x (prefill FLOPs / F + decode FLOPs / F_dec) + decode steps x overhead
                                                                   <= instances x dt x alive
    memory:   sum slowdown x decode bytes / B + decode steps x overhead
                                                                   <= instances x dt x alive
    KV time:  sum KV bytes held x seconds (each decode token holds its context's KV for at
              least one step, which lasts at least slowdown x W / B + overhead)
                                                                   <= instances x dt x alive x KV capacity
    link:     sum KV bytes of disaggregated fractions              <= link bandwidth x dt
    job:      sum of the job's fractions                           <= 1
    fit:      the pools of a set S serve at most the share of the job's tokens whose
              requests one of them holds

and the objective, the tokens of the served fractions. Physical limits (``limits``): a job
with a request no pool can serve (context length, KV of one instance, model placement) gets
no column at all, as no policy can meet it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np
from scipy.sparse import coo_matrix, csc_matrix

from phaseroute.schemas.enums import Phase
from phaseroute.sim.fleet import Fleet
from phaseroute.sim.limits import PoolLimits, check_phases, feasible_requests, fit_matrix
from phaseroute.sim.perfmodel import InstancePerf
from phaseroute.sim.workload import Workload

NO_CONTEXT_LIMIT = 2**62


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

    def subset(self, keep: np.ndarray) -> JobWork:
        """Only the jobs where ``keep`` is True (their requests renumbered to the new rows)."""
        keep = np.asarray(keep, dtype=bool)
        requests = None
        if self.requests is not None:
            group, L, O = self.requests  # noqa: E741
            new_row = np.cumsum(keep) - 1
            mine = keep[group]
            requests = (new_row[group[mine]], L[mine], O[mine])
        return JobWork([m for m, k in zip(self.model, keep, strict=True) if k], self.release[keep],
                       self.deadline[keep], self.tokens[keep], self.prompt[keep], self.prompt_sq[keep],
                       self.output[keep], self.ctx_out[keep], self.min_ctx, requests)

    def scaled(self, k: float) -> JobWork:
        """Every job k times larger (for the fluid capacity)."""
        return replace(self, tokens=self.tokens * k, prompt=self.prompt * k, prompt_sq=self.prompt_sq * k,
                       output=self.output * k, ctx_out=self.ctx_out * k)


def job_work(w: Workload) -> JobWork:
    L = w.req_prompt.astype(np.float64)
    O = w.req_output.astype(np.float64)  # noqa: E741
    def sums(v: np.ndarray) -> np.ndarray:
        return np.add.reduceat(v, w.job_first)
    return JobWork(
        model=w.job_model(), release=w.job_submit.copy(), deadline=w.job_deadline.copy(),
        tokens=sums(L + O), prompt=sums(L), prompt_sq=sums(L * L), output=sums(O),
        ctx_out=sums(O * (L + O / 2)), min_ctx=float(L.min() + 1) if len(L) else 1.0,
        requests=(w.req_job.astype(np.int64), L, O),
    )


def aggregate_by_model(jw: JobWork, start: float, end: float) -> JobWork:
    """One class per model holding all its jobs, released at ``start`` and due at ``end``."""
    models = sorted(set(jw.model))
    index = np.array([models.index(m) for m in jw.model], dtype=np.int64)
    def pick(v: np.ndarray) -> np.ndarray:
        return np.bincount(index, weights=v, minlength=len(models))
    n = len(models)
    requests = None
    if jw.requests is not None:
        requests = (index[jw.requests[0]], jw.requests[1], jw.requests[2])
    return JobWork(models, np.full(n, start), np.full(n, end), pick(jw.tokens), pick(jw.prompt), pick(jw.prompt_sq),
                   pick(jw.output), pick(jw.ctx_out), jw.min_ctx, requests)


@dataclass(frozen=True)
class LPPool:
    name: str
    parent: str
    model: str
    perf: InstancePerf
    instances: float
    phases: tuple[Phase, ...]
    nic: float             # bytes/s per accelerator
    price_per_hour: float  # per accelerator
    context_tokens: int = NO_CONTEXT_LIMIT

    def __post_init__(self) -> None:
        check_phases(self.name, self.phases)

    @property
    def limits(self) -> PoolLimits:
        return PoolLimits(self.name, self.model, self.phases, self.perf.kv_per_token, self.perf.kv_capacity,
                          self.context_tokens)


def lp_pools(fleet: Fleet) -> list[LPPool]:
    return [LPPool(p.name, p.parent, p.model, p.perf, float(p.instances), p.phases, p.accelerator.network_bandwidth,
                   p.price_per_hour, p.context_tokens) for p in fleet.pools]


def kv_time(jw: JobWork, p: LPPool) -> tuple[np.ndarray, np.ndarray]:
    """Per job on pool p: KV byte-seconds held by its decode tokens, split into the part that
    scales with slowdown (weight reads) and the fixed per-step overhead part."""
    f = p.perf
    held = f.kv_per_token * jw.ctx_out
    return held * f.weight_bytes / f.bandwidth, held * f.overhead


def costs(jw: JobWork, p: LPPool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Seconds of one instance of pool p per job: prefill compute, decode compute, decode memory, decode overhead."""
    f = p.perf
    fit = f.kv_capacity / (f.kv_per_token * jw.min_ctx) if f.kv_per_token > 0 else float(f.max_batch)
    batch = max(1.0, min(f.max_batch, math.floor(fit)))
    pre = (f.two_p * jw.prompt + f.pre_attn * jw.prompt_sq) / f.flops
    dec_c = (f.two_p * jw.output + f.dec_attn * jw.ctx_out) / f.flops_decode
    dec_m = (f.weight_bytes * jw.output / batch + f.kv_per_token * jw.ctx_out) / f.bandwidth
    over = f.overhead * jw.output / batch
    return pre, dec_c, dec_m, over


def timeline(fleet: Fleet | None, parent: str, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
        for (s0, al, sl), (s1, _, _) in itertools.pairwise(changes):
            lo, hi = max(a, s0), min(b, s1)
            if hi > lo and al:
                up += hi - lo
                factors.append(sl)
        alive[t] = up / (b - a)
        slow[t] = min(factors) if factors else 1.0
    return alive, slow


def placements(jw: JobWork, pools: list[LPPool]) -> dict[str, list[tuple[int, int]]]:
    out = {}
    for m in set(jw.model):
        idx = [i for i, p in enumerate(pools) if p.model == m]
        out[m] = [(a, b) for a in idx for b in idx
                  if Phase.PREFILL in pools[a].phases and Phase.DECODE in pools[b].phases
                  and (a != b or set(pools[a].phases) == {Phase.PREFILL, Phase.DECODE})]
    return out


def pool_sets(n: int) -> list[tuple[int, ...]]:
    """The sets of pools fit rows are written for: every non-empty set on small fleets, else
    each pool alone and each pool left out (the sets a lost pool leaves behind)."""
    if n <= 8:
        return [c for k in range(1, n + 1) for c in itertools.combinations(range(n), k)]
    return [(i,) for i in range(n)] + [tuple(k for k in range(n) if k != i) for i in range(n)]


def infeasible_job_rows(jw: JobWork, pools: list[LPPool]) -> np.ndarray:
    """bool[job]: a request of the job fits no placement of the fleet (``limits``)."""
    bad = np.zeros(len(jw.tokens), dtype=bool)
    if jw.requests is None:
        return bad
    group, L, O = jw.requests  # noqa: E741
    models = np.asarray(jw.model)[group] if len(group) else np.zeros(0, dtype=str)
    ok = feasible_requests([p.limits for p in pools], L, O, list(models))
    np.logical_or.at(bad, group, ~ok)
    return bad


@dataclass(frozen=True)
class FitBlock:
    """Pools ``members`` serve (in ``phase``: DECODE, the decode pool b, or PREFILL, the prefill
    pool a) at most ``share[j]`` of job j's tokens."""

    members: np.ndarray
    phase: Phase
    share: np.ndarray


def fit_blocks(jw: JobWork, pools: list[LPPool]) -> list[FitBlock]:
    """The pools of a set S together serve at most the share of a job's tokens whose requests
    fit an instance of some pool in S (prompt + output in KV for decode or colocated, the prompt
    for prefill). One pool alone is the plain fit; a set matters when a pool that alone holds
    the largest requests is lost: the others cannot take those requests' tokens between them."""
    if jw.requests is None:
        return []
    group, L, O = jw.requests  # noqa: E741
    J = len(jw.tokens)
    models = list(np.asarray(jw.model)[group]) if len(group) else []
    limits = [p.limits for p in pools]
    fits = {phase: fit_matrix(limits, L, O, models, phase) for phase in (Phase.DECODE, Phase.PREFILL)}
    sets = pool_sets(len(pools))
    out = []
    for phase in (Phase.DECODE, Phase.PREFILL):
        shares = {}
        for pool_set in sets:
            fits_any = fits[phase][np.array(pool_set)].any(axis=0)
            share = np.bincount(group, weights=(L + O) * fits_any, minlength=J) / np.maximum(jw.tokens, 1e-12)
            shares[pool_set] = np.minimum(share, 1.0)
        for pool_set in sets:
            share = shares[pool_set].copy()
            # a set whose one-pool-larger superset has the same share adds nothing for that job
            for k in range(len(pools)):
                bigger = tuple(sorted(set(pool_set) | {k}))
                if k not in pool_set and bigger in shares:
                    share[shares[bigger] <= share + 1e-12] = 1.0
            if (share >= 1 - 1e-12).all():
                continue
            out.append(FitBlock(np.array(pool_set), phase, share))
    return out


@dataclass(frozen=True)
class LPModel:
    """Every column of the bound and what it costs (arrays P x J per cost, P x T per pool timeline)."""

    jw: JobWork
    pools: list[LPPool]
    T: int
    dt: float
    alive: np.ndarray
    slow: np.ndarray
    pre: np.ndarray
    dec_c: np.ndarray
    dec_m: np.ndarray
    over: np.ndarray
    kvt_slow: np.ndarray
    kvt_fixed: np.ndarray
    kv_bytes: np.ndarray           # per job: KV moved if disaggregated
    links: dict[tuple[str, str], float]
    fits: list[FitBlock]
    excluded: np.ndarray           # bool per job: no column (infeasible)
    vj: np.ndarray                 # columns: job, prefill pool, decode pool, interval
    va: np.ndarray
    vb: np.ndarray
    vt: np.ndarray

    @property
    def n_columns(self) -> int:
        return len(self.vj)


def _columns(jw: JobWork, places: dict[str, list[tuple[int, int]]], dt: float, T: int,
             skip: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    parts = []
    for j in range(len(jw.tokens)):
        if skip[j]:
            continue
        t0 = min(int(np.floor(jw.release[j] / dt)), T - 1)
        t1 = min(max(int(np.ceil(jw.deadline[j] / dt)), t0 + 1), T)
        ts = np.arange(t0, t1)
        for a, b in places[jw.model[j]]:
            parts.append(np.stack([np.full(len(ts), j), np.full(len(ts), a), np.full(len(ts), b), ts]))
    if not parts:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, empty
    v = np.concatenate(parts, axis=1).astype(np.int64)
    return v[0], v[1], v[2], v[3]


def build_model(jw: JobWork, pools: list[LPPool], n_intervals: int, fleet: Fleet | None = None,
                links: dict[tuple[str, str], float] | None = None, horizon: float | None = None) -> LPModel:
    T = n_intervals
    end = horizon or float(jw.deadline.max())
    dt = end / T
    edges = np.linspace(0.0, end, T + 1)
    alive, slow = (np.array(x) for x in zip(*[timeline(fleet, p.parent, edges) for p in pools], strict=True))
    pre, dec_c, dec_m, over = (np.array(x) for x in zip(*[costs(jw, p) for p in pools], strict=True))
    kvt_slow, kvt_fixed = (np.array(x) for x in zip(*[kv_time(jw, p) for p in pools], strict=True))
    places = placements(jw, pools)
    kv = {m: next(p.perf.kv_per_token for p in pools if p.model == m) for m in places}
    kv_bytes = np.array([kv[m] for m in jw.model]) * jw.prompt
    excluded = infeasible_job_rows(jw, pools)
    vj, va, vb, vt = _columns(jw, places, dt, T, excluded)
    return LPModel(jw, pools, T, dt, alive, slow, pre, dec_c, dec_m, over, kvt_slow, kvt_fixed, kv_bytes,
                   dict(links or {}), fit_blocks(jw, pools), excluded, vj, va, vb, vt)


class Rows:
    """Sparse constraint rows A x <= b, allocated in blocks."""

    def __init__(self) -> None:
        self.n = 0
        self.r: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.b: list[np.ndarray] = []

    def block(self, rhs: np.ndarray | list[float]) -> int:
        start = self.n
        self.b.append(np.asarray(rhs, dtype=np.float64).ravel())
        self.n += len(self.b[-1])
        return start

    def add(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> None:
        self.r.append(np.asarray(rows, np.int64))
        self.c.append(np.asarray(cols, np.int64))
        self.v.append(np.asarray(vals, np.float64))

    def matrix(self, n_cols: int) -> tuple[csc_matrix, np.ndarray]:
        A = coo_matrix((np.concatenate(self.v), (np.concatenate(self.r), np.concatenate(self.c))),
                       shape=(self.n, n_cols)).tocsc()
        return A, np.concatenate(self.b)
