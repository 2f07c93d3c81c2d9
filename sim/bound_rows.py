"""The bound's constraint matrix: the rows of ``bound_model``'s docstring written for every column.

``assemble`` returns ``A x <= b`` and the objective ``c`` (maximize ``c x``) in one fixed
layout: the J job rows first (row j: the fractions of job j add up to at most 1), then
compute, memory and KV-time rows (P x T each), the fit rows and the link rows. The exact LP
passes every column to the solver; column generation (``bound_colgen``) passes a subset and
prices the rest against the same rows, so both solve the one LP. With ``size_pools`` the
instance counts become P extra columns (the capacity planner's relaxation): capacity rows
then read ``usage - size x capacity <= 0`` and one more row asks for ``min_token_fraction``
of the tokens.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csc_matrix

from phaseroute.schemas.enums import Phase
from phaseroute.sim.bound_model import LPModel, Rows

OBJECTIVES = ("tokens", "jobs")


def assemble(m: LPModel, size_pools: bool = False, min_token_fraction: float = 1.0,
             objective: str = "tokens") -> tuple[csc_matrix, np.ndarray, np.ndarray]:
    """``objective``: ``tokens`` (deadline-met tokens of the served fractions) or ``jobs`` (the
    served fractions themselves: at least the number of jobs any policy meets)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"bound objective must be one of {list(OBJECTIVES)}, got {objective!r}")
    pools, T, J = m.pools, m.T, len(m.jw.tokens)
    P = len(pools)
    vj, va, vb, vt = m.vj, m.va, m.vb, m.vt
    nx = len(vj)
    cols = np.arange(nx)
    inst = np.array([p.instances for p in pools])
    cap = m.alive * m.dt                                   # seconds per instance, P x T
    rows = Rows()
    r_job = rows.block(np.ones(J))
    rows.add(r_job + vj, cols, np.ones(nx))
    for cost_b in (m.dec_c, m.dec_m):                      # compute rows, then memory rows
        r0 = rows.block(np.zeros(P * T) if size_pools else cap * inst[:, None])
        if cost_b is m.dec_c:
            rows.add(r0 + va * T + vt, cols, m.pre[va, vj] * m.slow[va, vt])
        rows.add(r0 + vb * T + vt, cols, cost_b[vb, vj] * m.slow[vb, vt] + m.over[vb, vj])
        if size_pools:
            for i in range(P):
                rows.add(r0 + i * T + np.arange(T), np.full(T, nx + i), -cap[i])
    kv_cap = np.array([p.perf.kv_capacity for p in pools])
    r0 = rows.block(np.zeros(P * T) if size_pools else (cap * inst[:, None] * kv_cap[:, None]))
    rows.add(r0 + vb * T + vt, cols, m.kvt_slow[vb, vj] * m.slow[vb, vt] + m.kvt_fixed[vb, vj])
    if size_pools:
        for i in range(P):
            rows.add(r0 + i * T + np.arange(T), np.full(T, nx + i), -cap[i] * kv_cap[i])
    for fit in m.fits:
        # only jobs with share < 1: for the others the row repeats their job row (<= 1)
        jobs = np.flatnonzero(fit.share < 1 - 1e-12)
        position = np.full(J, -1, dtype=np.int64)
        position[jobs] = np.arange(len(jobs))
        r0 = rows.block(fit.share[jobs])
        sel = np.flatnonzero(np.isin(vb if fit.phase is Phase.DECODE else va, fit.members) & (position[vj] >= 0))
        rows.add(r0 + position[vj[sel]], sel, np.ones(len(sel)))
    _link_rows(rows, m, size_pools, nx)
    tok = m.jw.tokens[vj]
    if size_pools:
        r0 = rows.block([-min_token_fraction * m.jw.tokens.sum()])
        rows.add(np.full(nx, r0), cols, -tok)
        price = np.array([p.price_per_hour * p.perf.tp for p in pools])
        c = np.concatenate([np.zeros(nx), -price])          # maximize -cost
    else:
        c = tok.astype(np.float64) if objective == "tokens" else np.ones(nx)
    A, b = rows.matrix(nx + (P if size_pools else 0))
    return A, b, c


def _link_rows(rows: Rows, m: LPModel, size_pools: bool, nx: int) -> None:
    """Per link and interval: KV bytes of the disaggregated fractions <= bandwidth x dt (sized
    pools: the link scales with the accelerators at both ends)."""
    pools, T = m.pools, m.T
    va, vb, vt, vj = m.va, m.vb, m.vt, m.vj
    dis = np.flatnonzero(va != vb)
    parents = sorted({p.parent for p in pools})
    index = {name: k for k, name in enumerate(parents)}
    pool_parent = np.array([index[p.parent] for p in pools], dtype=np.int64)
    pair = pool_parent[va[dis]] * len(parents) + pool_parent[vb[dis]]
    for key in np.unique(pair):
        src, dst = parents[key // len(parents)], parents[key % len(parents)]
        sel = dis[pair == key]
        ends = (src, dst) if size_pools else (None,)
        for end_parent in ends:
            bw = 0.0 if size_pools else m.links.get((src, dst), 0.0)
            r0 = rows.block(np.full(T, bw * m.dt))
            rows.add(r0 + vt[sel], sel, m.kv_bytes[vj[sel]])
            for i, p in enumerate(pools):
                if size_pools and p.parent == end_parent:
                    rows.add(r0 + np.arange(T), np.full(T, nx + i), -np.full(T, p.perf.tp * p.nic * m.dt))
