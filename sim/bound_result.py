"""What a bound solve returns: the figures of a primal solution over the model's columns."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from phaseroute.sim.bound_model import LPModel


@dataclass
class LPResult:
    status: str
    objective_tokens: float          # tokens of the solution's served job fractions (the LP optimum when exact)
    cost_per_hour: float             # fleet cost of the solution's pool sizes
    job_fraction: np.ndarray
    pool_prefill_s: dict[str, float]  # instance-seconds of prefill per pool
    pool_decode_s: dict[str, float]
    instances: dict[str, float]
    kv_bytes: float
    variables: int
    solve_s: float
    upper_bound: float = math.nan   # dual bound on the LP optimum in the objective's units (column generation)
    columns_used: int = 0                  # columns passed to the solver
    rounds: int = 1                        # solver calls


def summarize(m: LPModel, x: np.ndarray, sizes: np.ndarray, status: str, started: float, **extra: Any) -> LPResult:
    """The figures of a primal solution ``x`` over the model's columns."""
    pools, jw = m.pools, m.jw
    vj, va, vb = m.vj, m.va, m.vb
    price = np.array([p.price_per_hour * p.perf.tp for p in pools])
    dis = va != vb
    served = np.maximum(m.dec_c[vb, vj], m.dec_m[vb, vj])
    return LPResult(
        status=status, objective_tokens=float((x * jw.tokens[vj]).sum()), cost_per_hour=float((sizes * price).sum()),
        job_fraction=np.bincount(vj, weights=x, minlength=len(jw.tokens)),
        pool_prefill_s={p.name: float((x * m.pre[va, vj])[va == i].sum()) for i, p in enumerate(pools)},
        pool_decode_s={p.name: float((x * served)[vb == i].sum()) for i, p in enumerate(pools)},
        instances={p.name: float(sizes[i]) for i, p in enumerate(pools)},
        kv_bytes=float((x[dis] * m.kv_bytes[vj[dis]]).sum()), variables=m.n_columns,
        solve_s=time.perf_counter() - started, **extra,
    )
