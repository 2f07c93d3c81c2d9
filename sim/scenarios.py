"""Scenarios: a pool slows down mid-run (stale profiles), a pool disappears mid-job.

``stale_profile``: pool X runs ``factor`` times slower from ``at_s`` on. Profiles measured
before are now wrong; only telemetry can tell. For each policy the share of the placed work
(prompt tokens + 2 x output tokens) sent to X over a trailing ``window_s`` is tracked; the reaction time is the delay until that
share has moved at least halfway from its level at the event toward X's share of the fleet's
capacity after the slowdown, and stays there for ``hold_s`` (or until the arrivals end).
``None`` means it never did while jobs were arriving.

``pool_loss``: pool X disappears at ``at_s``; in-flight work is re-placed by each policy's
retry/re-dispatch rule. Reported against the same run without the loss (and the bound of both).

``transfer_price``: the same workload and fleet with moving KV between pools free and at
``usd_per_gb``: per policy, the share of requests colocated, KV bytes moved per delivered
token, the transfer's dollars and goodput per dollar (which includes them). phaseroute's
router sees the price (``RouterConfig.transfer_usd_per_gb``); the baselines do not need to
(rr and jsq always colocate, split never does).

``bound=False`` skips the LP bound (each scenario solves it once or twice).
"""

from __future__ import annotations

from typing import Any

from phaseroute.sim.bound import deadline_bound
from phaseroute.sim.engine import SimConfig
from phaseroute.sim.fleet import Fleet, FleetEvent, with_events, with_transfer_price
from phaseroute.sim.runner import run_policy
from phaseroute.sim.workload import Workload


def _capacity_weights(fleet: Fleet) -> dict[str, float]:
    """Prefill token capacity per pool (instances x roofline prefill rate at a 2k prompt)."""
    return {p.name: p.instances * p.perf.prefill_tokens_per_s(2048) for p in fleet.pools}


def default_pool(fleet: Fleet) -> str:
    caps = _capacity_weights(fleet)
    best = max(fleet.pools, key=lambda p: (caps[p.name], p.name))
    return best.parent


def _work(v: dict[str, Any]) -> float:
    """Placed work in the scheduler's cost units: a prompt token 1, an output token 2 (VTC's default)."""
    work: float = v["routed_prefill_tokens"] + 2.0 * v["routed_decode_tokens"]
    return work


def placement_share(series: list[dict[str, Any]], pool_names: tuple[str, ...], window_s: float) -> list[tuple[float, float | None]]:
    """Share of the work placed on the pool (prompt tokens it prefills + 2 x output tokens it
    decodes), over a trailing window."""
    counts = []
    for row in series:
        total = sum(_work(v) for v in row["pools"].values())
        mine = sum(_work(row["pools"][n]) for n in pool_names)
        counts.append((row["t"], mine, total))
    out = []
    lo = 0
    acc_mine = acc_total = 0.0
    for t, mine, total in counts:
        acc_mine += mine
        acc_total += total
        while counts[lo][0] <= t - window_s:
            acc_mine -= counts[lo][1]
            acc_total -= counts[lo][2]
            lo += 1
        out.append((t, acc_mine / acc_total if acc_total else None))
    return out


def reaction_time(shares: list[tuple[float, float | None]], at_s: float, target_after: float, end_s: float,
                  window_s: float, hold_s: float) -> tuple[float | None, float | None, float | None]:
    """(reaction seconds or None, share before, share at the end of the arrivals): the first
    time after which the trailing-window share stays at least halfway from its level before the
    event toward the pool's capacity share after it, for ``hold_s`` (or until the arrivals end)."""
    before = [s for t, s in shares if t <= at_s and t >= at_s - window_s and s is not None]
    after = [(t, s) for t, s in shares if at_s < t <= end_s and s is not None]
    if not before or not after:
        return None, None, None
    pre = before[-1]
    goal = pre - 0.5 * (pre - target_after)
    end_share = after[-1][1]
    for i, (t, _) in enumerate(after):
        if all(x <= goal for u, x in after[i:] if u <= t + hold_s):
            return t - at_s, pre, end_share
    return None, pre, end_share


def _vs_bound(goodput: float, bound: dict[str, Any] | None) -> float | None:
    return round(goodput / bound["goodput_tok_s"], 4) if bound and bound["goodput_tok_s"] else None


def stale_profile(w: Workload, fleet: Fleet, policies: list[str], pool: str | None = None, at_s: float | None = None,
                  factor: float = 4.0, config: SimConfig = SimConfig(sample_s=10.0), window_s: float = 60.0,
                  hold_s: float = 120.0, bound: bool = True) -> dict[str, Any]:
    pool = pool or default_pool(fleet)
    at_s = at_s if at_s is not None else float(w.job_submit.min() + 0.4 * w.span_s)
    slowed = with_events(fleet, [FleetEvent(at_s, pool, "slowdown", factor)])
    names = fleet.parents[pool]
    caps = _capacity_weights(fleet)
    mine = sum(caps[n] for n in names)
    target_after = (mine / factor) / (sum(caps.values()) - mine + mine / factor)
    doc: dict[str, Any] = {"pool": pool, "at_s": round(at_s, 1), "factor": factor,
                 "capacity_share_before": round(mine / sum(caps.values()), 4),
                 "capacity_share_after": round(target_after, 4), "bound": deadline_bound(w, slowed) if bound else None,
                 "policies": {}}
    for name in policies:
        sim, m = run_policy(w, slowed, name, config)
        shares = placement_share(sim.series, names, window_s)
        end_s = float(w.job_submit.max())
        react, pre, end = reaction_time(shares, at_s, target_after, end_s, window_s, hold_s)
        doc["policies"][name] = {
            "reaction_s": None if react is None else round(react, 1),
            "share_before": None if pre is None else round(pre, 4), "share_at_end": None if end is None else round(end, 4),
            "goodput_tok_s": m["goodput_tok_s"], "miss_rate": m["miss_rate"],
            "goodput_vs_bound": _vs_bound(m["goodput_tok_s"], doc["bound"]),
            "share_series": [(round(t, 1), None if s is None else round(s, 4)) for t, s in shares
                             if at_s - 600 <= t <= at_s + 1800],
        }
    return doc


def pool_loss(w: Workload, fleet: Fleet, policies: list[str], pool: str | None = None, at_s: float | None = None,
              config: SimConfig = SimConfig(sample_s=10.0), bound: bool = True) -> dict[str, Any]:
    pool = pool or default_pool(fleet)
    at_s = at_s if at_s is not None else float(w.job_submit.min() + 0.5 * w.span_s)
    lost = with_events(fleet, [FleetEvent(at_s, pool, "loss")])
    doc: dict[str, Any] = {"pool": pool, "at_s": round(at_s, 1), "bound_without": deadline_bound(w, fleet) if bound else None,
                 "bound_with": deadline_bound(w, lost) if bound else None, "policies": {}}
    for name in policies:
        _, base = run_policy(w, fleet, name, config)
        _, hit = run_policy(w, lost, name, config)
        doc["policies"][name] = {
            "miss_rate_without": base["miss_rate"], "miss_rate_with": hit["miss_rate"],
            "miss_rate_impact": round(hit["miss_rate"] - base["miss_rate"], 4),
            "goodput_without": base["goodput_tok_s"], "goodput_with": hit["goodput_tok_s"],
            "goodput_vs_bound_with": _vs_bound(hit["goodput_tok_s"], doc["bound_with"]),
            "requests_replaced": hit["requests_lost"], "requests_retried": hit["requests_retried"],
            "requests_gave_up": hit["requests_gave_up"], "jobs_failed": hit["jobs_failed"],
            "jobs_rejected": hit["jobs_rejected"],
        }
    return doc


TRANSFER_FIGURES = ("miss_rate", "goodput_tok_s", "colocated_share", "kv_bytes_moved", "kv_bytes_per_delivered_token",
                    "rental_cost_usd", "transfer_cost_usd", "cost_usd", "goodput_tokens_per_dollar")


def transfer_price(w: Workload, fleet: Fleet, policies: list[str], usd_per_gb: float,
                   config: SimConfig | None = None) -> dict[str, Any]:
    """Each policy with KV transfer free and at ``usd_per_gb``."""
    config = config or SimConfig()
    if not usd_per_gb > 0:
        raise ValueError(f"the transfer scenario needs a price > 0 dollars per GB, got {usd_per_gb!r}")
    doc: dict[str, Any] = {"usd_per_gb": usd_per_gb, "policies": {}}
    for name in policies:
        runs = {}
        for price in (0.0, usd_per_gb):
            _, m = run_policy(w, with_transfer_price(fleet, price), name, config)
            runs["free" if price == 0.0 else "priced"] = {k: m[k] for k in TRANSFER_FIGURES}
        doc["policies"][name] = runs
    return doc
