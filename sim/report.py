"""``phaseroute sim report``: capacity at SLO (the headline), a load sweep, the scenarios, plots, Markdown.

The headline is each policy's capacity at SLO (``capacity``: the highest offered load whose
job deadline-miss rate stays within the SLO, mean and range over the seeds) and its ratios
to the best baseline and to the bound; a single run at one load does not separate policies.
Writes into ``out_dir``: results.json (every document), capacity.png, goodput_vs_load.png,
miss_rate_vs_load.png, pool_utilization.png (each policy's pools over time at the reference
load), tenant_share.png (share under contention vs weight), stale_profile.png (share of the
slowed pool over time) and report.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from phaseroute.sim.capacity import CapacityOptions, capacity_study
from phaseroute.sim.capacity_plot import plot_capacity
from phaseroute.sim.engine import SimConfig
from phaseroute.sim.fleet import Fleet
from phaseroute.sim.runner import POLICIES, prepare, run_all
from phaseroute.sim.scenarios import pool_loss, stale_profile
from phaseroute.sim.workload import WorkloadSpec


def _plot_sweep(sweep: list[dict[str, Any]], key: str, ylabel: str, path: Path, with_bound: bool) -> None:
    with_bound = with_bound and all("bound" in d for d in sweep)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    loads = [d["offered_load"] for d in sweep]
    for name in sweep[0]["policies"]:
        ax.plot(loads, [d["policies"][name][key] for d in sweep], marker="o", label=name)
    if with_bound:
        ax.plot(loads, [d["bound"]["goodput_tok_s"] for d in sweep], "k--", label="LP bound")
    ax.set_xlabel("offered load (fraction of fluid capacity)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_util(doc: dict[str, Any], path: Path) -> None:
    names = list(doc["policies"])
    fig, axes = plt.subplots(len(names), 1, figsize=(7, 1.9 * len(names)), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        series = doc["policies"][name]["series"]
        t = [r["t"] / 60 for r in series]
        for pool in series[0]["pools"]:
            ax.plot(t, [r["pools"][pool]["util"] for r in series], label=pool)
        ax.set_title(name, fontsize=9)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("util")
        ax.legend(fontsize=7, loc="upper right")
    axes[-1, 0].set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_tenants(doc: dict[str, Any], path: Path) -> None:
    names = list(doc["policies"])
    tenants = list(next(iter(doc["policies"].values()))["tenants"])
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / (len(names) + 1)
    for k, tenant in enumerate(tenants):
        first = next(iter(doc["policies"].values()))["tenants"][tenant]
        w = first.get("fair_share_when_contended") or first["weight_share"]
        ax.bar(k, w, width, color="k", alpha=0.3, label="weighted fair share" if k == 0 else None)
        for i, name in enumerate(names):
            v = doc["policies"][name]["tenants"][tenant]["contended_share"] or 0.0
            ax.bar(k + (i + 1) * width, v, width, label=name if k == 0 else None, color=f"C{i}")
    ax.set_xticks([k + 0.4 for k in range(len(tenants))], tenants)
    ax.set_ylabel("share of tokens released while backlogged")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_stale(doc: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, p in doc["policies"].items():
        pts = [(t, s) for t, s in p["share_series"] if s is not None]
        ax.plot([(t - doc["at_s"]) / 60 for t, _ in pts], [s for _, s in pts], label=name)
    ax.axvline(0, color="k", lw=0.8)
    ax.axhline(doc["capacity_share_after"], color="k", ls=":", label="capacity share after")
    ax.set_xlabel(f"minutes after pool {doc['pool']} slowed {doc['factor']}x")
    ax.set_ylabel(f"share of placed work on {doc['pool']} (60 s window)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_report(workload: WorkloadSpec | str | Path | dict[str, Any], fleet: Fleet | str | Path | dict[str, Any],
                 out_dir: str | Path, loads: Sequence[float] = (0.3, 0.5, 0.7, 0.9, 1.1), policies: list[str] | None = None,
                 seed: int | None = None, max_requests: int | None = None, reference_load: float = 0.7,
                 scenarios: bool = True, log: Callable[[str], None] = print, capacity: CapacityOptions | None = None,
                 bound: bool = True) -> dict[str, Any]:
    """``capacity``: the options of the headline capacity search (None skips it)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = SimConfig(seed=seed or 0)
    results: dict[str, Any] = {}
    if capacity is not None:
        log("capacity at SLO")
        results["capacity"] = capacity_study(workload, fleet, policies or list(POLICIES), capacity, log)
        plot_capacity(results["capacity"], out / "capacity.png")
    sweep = []
    for load in loads:
        w, f, info = prepare(workload, fleet, load, seed, max_requests)
        log(f"load {load}: {w.n_requests} requests, {w.n_jobs} jobs")
        sweep.append(run_all(w, f, policies, cfg, bound=bound, series=abs(load - reference_load) < 1e-9, info=info))
    results["sweep"] = sweep
    ref = next((d for d in sweep if abs(d.get("target_load", -1) - reference_load) < 1e-9), None)
    _plot_sweep(sweep, "goodput_tok_s", "deadline-met goodput (tokens/s)", out / "goodput_vs_load.png", True)
    _plot_sweep(sweep, "miss_rate", "job deadline-miss rate", out / "miss_rate_vs_load.png", False)
    if ref is None:
        w, f, info = prepare(workload, fleet, reference_load, seed, max_requests)
        ref = run_all(w, f, policies, cfg, bound=bound, series=True, info=info)
        results["reference"] = ref
    _plot_util(ref, out / "pool_utilization.png")
    _plot_tenants(ref, out / "tenant_share.png")
    if scenarios:
        w, f, _ = prepare(workload, fleet, reference_load, seed, max_requests)
        names = policies or ["phaseroute", "static-spec", "jsq"]
        log("stale-profile scenario")
        results["stale_profile"] = stale_profile(w, f, names, config=SimConfig(seed=seed or 0, sample_s=10.0),
                                                 bound=bound)
        _plot_stale(results["stale_profile"], out / "stale_profile.png")
        log("pool-loss scenario")
        results["pool_loss"] = pool_loss(w, f, names, config=SimConfig(seed=seed or 0, sample_s=10.0), bound=bound)
    for d in sweep:
        for m in d["policies"].values():
            m.pop("series", None)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "report.md").write_text(markdown(results, ref))
    return results


def _table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def _capacity_section(cap: dict[str, Any]) -> list[str]:
    rows = []
    for name, p in cap["policies"].items():
        c, money = p["capacity"], p.get("goodput_tokens_per_dollar_at_capacity")
        rows.append({"policy": name, "capacity_mean": c["mean"], "range": f"{c['min']}-{c['max']}",
                     "per_seed": c["per_seed"], "goodput_per_dollar_at_capacity": money and money["mean"],
                     "goodput_per_dollar_range": money and f"{money['min']:.0f}-{money['max']:.0f}"})
    if "bound" in cap:
        c = cap["bound"]["capacity"]
        rows.append({"policy": "bound", "capacity_mean": c["mean"], "range": f"{c['min']}-{c['max']}",
                     "per_seed": c["per_seed"]})
    parts = [f"## Capacity at SLO (job deadline-miss rate <= {cap['slo']}; seeds {cap['options']['seeds']})", "",
             _table(rows, ["policy", "capacity_mean", "range", "per_seed", "goodput_per_dollar_at_capacity",
                           "goodput_per_dollar_range"]), ""]
    for key, r in cap.get("ratios", {}).items():
        if r:
            parts.append(f"- {key.replace('_', ' ')}: {r.get('of_means')} (per seed {r.get('per_seed')}"
                         + (f", best baseline {r['best_baseline']}" if "best_baseline" in r else "") + ")")
    drivers = ", ".join(f"{n}: {m}" for n, m in cap.get("drivers", {}).items())
    return [*parts, "", f"Drivers: {drivers}.", "", "![capacity](capacity.png)", ""]


def markdown(results: dict[str, Any], ref: dict[str, Any]) -> str:
    parts = [f"# Fleet simulation: {ref['workload']['name']} on {ref['fleet']['name']}", ""]
    if "capacity" in results:
        parts += _capacity_section(results["capacity"])
    parts.append(f"{ref['workload']['requests']} requests in {ref['workload']['jobs']} jobs, offered load "
                 f"{ref.get('offered_load')}, fleet {ref['fleet']['accelerators']} accelerators at "
                 f"${ref['fleet']['cost_per_hour']}/h.")
    parts += ["", "## At the reference load (does not separate the policies; see capacity above)", "",
              _table(ref["summary"], ["policy", "goodput_tok_s", "vs_bound", "miss_rate",
              "cost_usd", "goodput_tokens_per_dollar", "kv_gb_moved", "wall_s"]), ""]
    parts += ["## Load sweep", ""]
    rows = []
    for d in results["sweep"]:
        row = {"load": d["offered_load"], "bound": round(d["bound"]["goodput_tok_s"], 1) if "bound" in d else None}
        row.update({n: m["goodput_tok_s"] for n, m in d["policies"].items()})
        rows.append(row)
    parts += [_table(rows, list(rows[0])), "", "![goodput](goodput_vs_load.png) ![miss](miss_rate_vs_load.png)", ""]
    parts += ["![utilization](pool_utilization.png)", "", "![tenants](tenant_share.png)", ""]
    if "stale_profile" in results:
        s = results["stale_profile"]
        parts += [f"## Stale profiles: pool {s['pool']} {s['factor']}x slower at t={s['at_s']} s", "",
                  f"Capacity share of {s['pool']}: {s['capacity_share_before']} before, {s['capacity_share_after']} after.", "",
                  _table([{"policy": n, **{k: v for k, v in p.items() if k != 'share_series'}} for n, p in s["policies"].items()],
                         ["policy", "reaction_s", "share_before", "share_at_end", "goodput_tok_s", "goodput_vs_bound", "miss_rate"]),
                  "", "![stale](stale_profile.png)", ""]
    if "pool_loss" in results:
        s = results["pool_loss"]
        parts += [f"## Pool loss: {s['pool']} disappears at t={s['at_s']} s", "",
                  (f"Bound: {s['bound_without']['goodput_tok_s']:.1f} tokens/s without, "
                   f"{s['bound_with']['goodput_tok_s']:.1f} with the loss." if s["bound_with"] else "Bound not solved."), "",
                  _table([{"policy": n, **p} for n, p in s["policies"].items()],
                         ["policy", "miss_rate_without", "miss_rate_with", "miss_rate_impact", "goodput_with",
                          "goodput_vs_bound_with", "requests_replaced", "requests_gave_up"]), ""]
    return "\n".join(parts)
