"""Column generation for the LP bound, with a dual bound that holds even when it stops early.

The LP (``bound_model``/``bound_rows``) has a column per (job, placement, interval): about a
million for 2,000 jobs on three pools, while an optimal basis uses at most one column per
row (a few thousand). Column generation solves a restricted LP over a subset of the columns
(the *master*), reads its row duals, prices every column against them, adds the columns of
each job that would improve the master, and repeats.

Why the reported figure is an upper bound (the proof the tests check numerically): the LP is
``max c x`` s.t. ``A x <= b, x >= 0`` with ``A >= 0`` elementwise (costs, fit and job rows are
non-negative). Weak duality: for any ``y >= 0`` with ``A^T y >= c``, ``b y >= c x`` for every
feasible x. From the master's duals keep the resource and fit parts ``y_r >= 0`` (negative
solver noise clipped to 0, which only raises ``A^T y``) and choose the job-row parts afresh:
``u_j = max(0, max over ALL columns k of job j of c_k - sum_r a_rk y_r)``. Every column has
coefficient 1 in its job's row, so each column's dual constraint ``u_j + sum_r a_rk y_r >= c_k``
holds: ``(y_r, u)`` is dual feasible for the full LP, and

    upper bound = sum_r b_r y_r + sum_j u_j       (job rows have b_j = 1)

bounds the LP optimum, which bounds every policy (``bound``). It equals the master's
optimum once no column prices out (then the master is optimal for the full LP); stopped
earlier, it is still valid, only looser. Columns with a positive coefficient in a row of
zero capacity (a lost pool's intervals) can never be non-zero; they are left out of the
pricing, which is valid because the dual of such a row costs nothing (``b_r = 0``) and can be
raised until those columns are dual feasible. Rows are scaled to right-hand side 1 and the
objective by the largest job's tokens, which changes neither the LP nor the argument.

The master lives in one HiGHS instance (``highspy``): the first solve runs the interior-point
method with crossover (a basis from a cold start, fast on these LPs), and every later round
adds its columns and re-solves with the simplex method from the previous basis, a few
hundred pivots instead of a new solve.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import highspy
import numpy as np
from scipy.sparse import csc_matrix, diags

from phaseroute.sim.bound_model import LPModel
from phaseroute.sim.bound_result import LPResult, summarize
from phaseroute.sim.bound_rows import assemble
from phaseroute.sim.solver_io import quiet_solver


class _Master:
    """The restricted LP ``max c x, A[:, cols] x <= b`` in one HiGHS instance, grown column by column."""

    def __init__(self, A: csc_matrix, b: np.ndarray, c: np.ndarray, time_limit_s: float):
        self.A, self.c = A, c
        self.cols = np.zeros(0, dtype=np.int64)
        self.h = highspy.Highs()  # type: ignore[no-untyped-call]  # highspy: Highs.__init__ is unannotated
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("time_limit", float(time_limit_s))
        self.h.setOptionValue("solver", "ipm")
        none = np.zeros(0, dtype=np.int32)
        self.h.addRows(len(b), np.full(len(b), -highspy.kHighsInf), b, 0, none, none, np.zeros(0))

    def add(self, cols: np.ndarray) -> None:
        sub = self.A[:, cols].tocsc()
        n = len(cols)
        self.h.addCols(n, -self.c[cols], np.zeros(n), np.full(n, highspy.kHighsInf), sub.nnz,
                       sub.indptr[:-1].astype(np.int32), sub.indices.astype(np.int32), sub.data)
        self.cols = np.concatenate([self.cols, cols])

    def solve(self) -> tuple[str | None, np.ndarray, np.ndarray, float]:
        """(None or why it failed, x over ``cols``, row duals y >= 0 of the max problem, objective)."""
        with quiet_solver():
            self.h.run()
        self.h.setOptionValue("solver", "simplex")      # later rounds start from this basis
        status = self.h.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            return self.h.modelStatusToString(status), np.zeros(0), np.zeros(0), 0.0
        sol = self.h.getSolution()
        y = np.maximum(-np.asarray(sol.row_dual), 0.0)
        return None, np.asarray(sol.col_value), y, -float(self.h.getInfo().objective_function_value)


def _initial_columns(m: LPModel, live: np.ndarray) -> np.ndarray:
    """Per job and placement: the first, middle and last interval of its window."""
    key = np.stack([m.vj, m.va, m.vb])[:, live]
    idx = np.flatnonzero(live)
    if not len(idx):
        return idx
    start = np.flatnonzero(np.r_[True, (np.diff(key, axis=1) != 0).any(axis=0)])
    stop = np.r_[start[1:], len(idx)] - 1
    picks = np.unique(np.concatenate([start, stop, (start + stop) // 2]))
    out: np.ndarray = idx[picks]
    return out


def _best_per_job(cols: np.ndarray, jobs: np.ndarray, score: np.ndarray, per_job: int) -> np.ndarray:
    """The ``per_job`` highest-scoring of ``cols`` for each job."""
    order = np.lexsort((-score, jobs))
    cols, jobs = cols[order], jobs[order]
    first = np.r_[0, np.flatnonzero(np.diff(jobs)) + 1]
    rank = np.arange(len(jobs)) - np.repeat(first, np.diff(np.r_[first, len(jobs)]))
    best: np.ndarray = cols[rank < per_job]
    return best


def _scaled(m: LPModel, objective: str) -> tuple[csc_matrix, np.ndarray, np.ndarray, float]:
    """Rows scaled to right-hand side 1 (0 stays 0), objective to its largest coefficient."""
    A, b, c = assemble(m, objective=objective)
    scale_rows = np.where(b > 0, 1.0 / np.where(b > 0, b, 1.0), 1.0)
    tok_scale = float(c.max())
    return (diags(scale_rows) @ A).tocsc(), b * scale_rows, c / tok_scale, tok_scale


def solve_colgen(m: LPModel, rel_gap: float = 1e-4, max_rounds: int = 80, time_limit_s: float = 600.0,
                 per_job: int = 6, log: Callable[[str], None] | None = None, objective: str = "tokens") -> LPResult:
    """The bound of ``m`` by column generation; ``upper_bound`` is the dual bound (of the
    served fractions' sum instead when ``objective`` is ``jobs``)."""
    started = time.perf_counter()
    J, n = len(m.jw.tokens), m.n_columns
    inst = np.array([p.instances for p in m.pools])
    if n == 0:
        return summarize(m, np.zeros(0), inst, "optimal", started, upper_bound=0.0)
    A, b, c, tok_scale = _scaled(m, objective)
    dead_rows = np.flatnonzero(b <= 0)
    live = (np.asarray(A[dead_rows].max(axis=0).todense()).ravel() <= 0) if len(dead_rows) else np.ones(n, bool)
    whole = m.jw.tokens if objective == "tokens" else np.ones(J)
    upper = float(whole[~m.excluded].sum()) / tok_scale          # every feasible job served whole
    master = _Master(A, b, c, time_limit_s)
    master.add(_initial_columns(m, live))
    in_master = np.zeros(n, dtype=bool)
    status, rounds, x = "optimal", 0, np.zeros(n)
    while True:
        rounds += 1
        in_master[master.cols] = True
        failed, x_master, y, primal = master.solve()
        if failed is not None:
            status = f"master LP {failed} in round {rounds} (dual bound of the last solved round reported)"
            break
        x = np.zeros(n)
        x[master.cols] = x_master
        y_job = y[:J].copy()
        y[:J] = 0.0
        gain = c - A.T @ y                                  # c_k - sum_r a_rk y_r, every column
        gain[~live] = -np.inf
        u = np.zeros(J)
        np.maximum.at(u, m.vj, gain)
        upper = min(upper, float(b @ y + u.sum()))
        if log is not None:
            log(f"bound round {rounds}: {len(master.cols)} columns, master {primal * tok_scale:.6g} {objective}, "
                f"dual bound {upper * tok_scale:.6g}, {time.perf_counter() - started:.1f} s")
        if upper - primal <= rel_gap * max(upper, 1e-12):
            break
        reduced = gain - y_job[m.vj]
        new = np.flatnonzero((reduced > 1e-9) & ~in_master)
        if not len(new) or rounds >= max_rounds or time.perf_counter() - started > time_limit_s:
            status = "optimal" if not len(new) else f"stopped after {rounds} rounds (dual bound reported)"
            break
        master.add(_best_per_job(new, m.vj[new], reduced[new], per_job))
    return summarize(m, x, inst, status, started, upper_bound=upper * tok_scale,
                     columns_used=int(in_master.sum()), rounds=rounds)
