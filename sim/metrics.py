"""Metrics of one finished simulation: goodput, misses, cost, utilization, fairness, series.

Definitions (the same for every policy and for the bound):
- deadline-met goodput: prompt + output tokens of the requests of jobs that finished by their
  deadline, divided by the workload's offered window (first to last job submission). A job
  rejected at admission, failed, or late counts as a miss (all of its tokens are lost).
- infeasible jobs: jobs with a request no pool of the fleet can serve (``limits``: context
  length, KV of one instance, model placement); misses for every policy alike.
- cost: the fleet is rented from t = 0 until the policy's last completion (a pool lost
  mid-run stops billing when lost), plus the KV moved between pools at the fleet's
  ``transfer_usd_per_gb``; cost per million tokens divides by ALL completed tokens,
  goodput per dollar divides deadline-met tokens by the same cost. KV bytes moved per
  delivered token: bytes of every finished transfer / prompt + output tokens of the
  completed requests.
- utilization: busy engine time / (instances x billed time) per pool.
- tenant share under contention: share of released tokens over the samples in which at
  least two tenants stayed backlogged, next to the weight share over the same samples.
- busy cost: accelerator-seconds actually busy x price (what the work cost if idle capacity
  were released or resold); goodput per busy dollar rewards placing work where it is cheap.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from phaseroute.schemas.enums import JobState
from phaseroute.sim.limits import infeasible_jobs

if TYPE_CHECKING:
    from phaseroute.sim.engine import Simulator


def _r(x: float, nd: int = 4) -> float:
    return round(float(x), nd) if math.isfinite(x) else float(x)


def compute_metrics(sim: Simulator) -> dict[str, Any]:
    w = sim.w
    done_t = np.array(sim.job_done_t, dtype=np.float64)
    states = np.array([s.value for s in sim.job_state])
    met = (states == JobState.COMPLETED.value) & (done_t <= w.job_deadline + 1e-9)
    tokens = w.job_tokens.astype(np.float64)
    t_done = np.array(sim.t_done[: w.n_requests], dtype=np.float64)   # later rows are speculative copies
    completed = ~np.isnan(t_done)
    completed_tokens = float((w.req_prompt + w.req_output)[completed].sum())
    makespan = float(np.nanmax(t_done)) if completed.any() else sim.now
    cost = 0.0
    busy_cost = 0.0
    pools = {}
    for i, p in enumerate(sim.pools):
        end = sim.pool_end_t[i] if not math.isnan(sim.pool_end_t[i]) else makespan
        billed = min(end, makespan)
        cost += p.spec.cost_per_hour * billed / 3600.0
        busy = sum(inst.busy_s for inst in p.instances)
        busy_cost += busy * p.spec.perf.tp * p.spec.price_per_hour / 3600.0
        pools[p.spec.name] = {
            "accelerator": p.spec.accelerator.name, "instances": p.spec.instances,
            "utilization": _r(busy / (p.spec.instances * billed)) if billed > 0 else 0.0,
            "prefill_tokens": int(sim.tel.total_tokens[i][0]), "decode_tokens": int(sim.tel.total_tokens[i][1]),
            "failures": p.failures, "lost_at_s": None if math.isnan(sim.pool_end_t[i]) else _r(sim.pool_end_t[i], 1),
        }
    met_tokens = float(tokens[met].sum())
    n_jobs = max(w.n_jobs, 1)
    late = (states == JobState.COMPLETED.value) & ~met
    kv_bytes = float(sim.counters["kv_bytes"])
    transfer_cost = sim.fleet.transfer_cost_usd(kv_bytes)
    rental_cost = cost
    cost += transfer_cost
    busy_cost += transfer_cost
    return {
        "policy": sim.driver.name,
        "goodput_tok_s": _r(met_tokens / w.span_s, 2),
        "deadline_met_tokens": met_tokens,
        "jobs": w.n_jobs, "jobs_met": int(met.sum()),
        "miss_rate": _r(1.0 - met.sum() / n_jobs),
        "token_miss_rate": _r(1.0 - met_tokens / max(float(tokens.sum()), 1.0)),
        "jobs_late": int(late.sum()), "jobs_rejected": int((states == JobState.REJECTED.value).sum()),
        "jobs_failed": int((states == JobState.FAILED.value).sum()), "jobs_unfinished": int((states == JobState.ADMITTED.value).sum()),
        "jobs_infeasible": int(infeasible_jobs(sim.fleet, w).sum()),
        "completed_tokens": completed_tokens, "makespan_s": _r(makespan, 1),
        "cost_usd": _r(cost, 2), "rental_cost_usd": _r(rental_cost, 2), "transfer_cost_usd": _r(transfer_cost, 2),
        "cost_per_million_tokens": _r(cost / (completed_tokens / 1e6), 4) if completed_tokens else None,
        "goodput_tokens_per_dollar": _r(met_tokens / cost, 1) if cost > 0 else None,
        "busy_cost_usd": _r(busy_cost, 2),
        "goodput_tokens_per_busy_dollar": _r(met_tokens / busy_cost, 1) if busy_cost > 0 else None,
        "pools": pools,
        "kv_bytes_moved": kv_bytes, "kv_transfers": sim.counters["transfers"],
        "kv_bytes_per_delivered_token": _r(kv_bytes / completed_tokens, 1) if completed_tokens else None,
        "transfer_usd_per_million_tokens": (_r(transfer_cost / (completed_tokens / 1e6), 4) if completed_tokens
                                            else None),
        "colocated_share": _colocated_share(sim),
        "requests_lost": sim.counters["requests_lost"], "requests_retried": sim.counters["retries"],
        "requests_gave_up": sim.counters["gave_up"], "requests_speculated": sim.counters["speculated"],
        "speculation_wins": sim.counters["speculation_wins"],
        "no_placement": sim.counters["no_placement"], "events": sim.counters["events"],
        "tenants": tenant_shares(sim, met),
        "lateness_p90_s": _lateness(done_t, w.job_deadline, met, states),
    }


def _colocated_share(sim: Simulator) -> float | None:
    """Share of the completed requests whose last attempt ran both phases on one pool."""
    done = [c for c, t in zip(sim.colo[: sim.w.n_requests], sim.t_done[: sim.w.n_requests], strict=True)
            if not math.isnan(t)]
    return _r(sum(done) / len(done)) if done else None


def _lateness(done_t: np.ndarray, deadline: np.ndarray, met: np.ndarray, states: np.ndarray) -> float | None:
    late = (states == JobState.COMPLETED.value) & ~met
    if not late.any():
        return 0.0
    return _r(float(np.percentile(done_t[late] - deadline[late], 90)), 1)


def tenant_shares(sim: Simulator, met: np.ndarray) -> dict[str, Any]:
    """Per tenant: share of the tokens released while it and at least one other tenant stayed
    backlogged (requests waiting at both ends of a sample), next to its weight share over the
    same samples (weights renormalized over the tenants backlogged in each sample)."""
    w = sim.w
    names = [t.name for t in w.tenants]
    weights = np.array([t.weight for t in w.tenants])
    got, fair = np.zeros(len(names)), np.zeros(len(names))
    prev = None
    for row in sim.series:
        waiting = np.array([row["tenants"][n]["waiting"] > 0 for n in names])
        if prev is not None:
            both = waiting & prev
            if both.sum() >= 2:
                released = np.array([row["tenants"][n]["released_tokens"] for n in names]) * both
                got += released
                fair += released.sum() * both * weights / (weights * both).sum()
        prev = waiting
    out = {}
    tokens = w.job_tokens
    for k, name in enumerate(names):
        mine = w.job_tenant == k
        out[name] = {
            "weight": float(weights[k]), "weight_share": _r(weights[k] / weights.sum()),
            "contended_share": _r(got[k] / got.sum()) if got.sum() > 0 else None,
            "fair_share_when_contended": _r(fair[k] / fair.sum()) if fair.sum() > 0 else None,
            "jobs": int(mine.sum()), "jobs_met": int((met & mine).sum()),
            "goodput_tok_s": _r(float(tokens[met & mine].sum()) / w.span_s, 2),
        }
    return out


def compact_series(sim: Simulator, max_points: int = 200) -> list[dict[str, Any]]:
    """The time series, thinned to at most ``max_points`` rows."""
    rows = sim.series
    step = max(1, math.ceil(len(rows) / max_points))
    return rows[::step]
