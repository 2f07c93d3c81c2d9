"""One run: every policy on the same workload and fleet, plus the upper bound, as one document.

``prepare`` builds the workload for a fleet (optionally at a target offered load), ``run_all``
simulates each policy from the same seed and solves the LP bound, and returns the JSON
document ``phaseroute sim --json`` prints.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from phaseroute.sim.bound import deadline_bound, max_throughput
from phaseroute.sim.core_driver import CoreDriver, PhaserouteOptions
from phaseroute.sim.drivers import BASELINES, Driver
from phaseroute.sim.engine import SimConfig, Simulator
from phaseroute.sim.fleet import Fleet, load_fleet
from phaseroute.sim.metrics import compact_series, compute_metrics
from phaseroute.sim.workload import Workload, WorkloadSpec, build_workload, load_workload_spec
from phaseroute.streams.policy import RouterConfig

POLICIES = ("phaseroute", "static-spec", "rr", "jsq", "split")
EXTRA_POLICIES = ("phaseroute-poolkv",)   # variants run only when named


def make_driver(name: str, fleet: Fleet | None = None) -> Driver | CoreDriver:
    """The driver of policy ``name``; with ``fleet``, the phaseroute routers are configured with
    its price of inter-pool traffic (the baselines never look at prices)."""
    router = RouterConfig(transfer_usd_per_gb=fleet.transfer_usd_per_gb if fleet is not None else 0.0)
    if name == "phaseroute":
        return CoreDriver(PhaserouteOptions(router=router))
    if name == "phaseroute-poolkv":     # ablation: the router sees only the pool's summed free KV, not per worker
        return CoreDriver(PhaserouteOptions(per_worker_kv=False, router=router), name=name)
    if name == "static-spec":
        return CoreDriver(PhaserouteOptions(profiles="datasheet", router=router))
    if name in BASELINES:
        return BASELINES[name]()
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)} (or 'all')")


def parse_policies(text: str) -> list[str]:
    names = list(POLICIES) if text == "all" else [p.strip() for p in text.split(",") if p.strip()]
    unknown = [n for n in names if n not in POLICIES + EXTRA_POLICIES]
    if unknown or not names:
        raise ValueError(f"unknown policy {', '.join(unknown) or repr(text)}; known: {', '.join(POLICIES)} (or 'all')")
    return names


def offered_tokens_per_s(w: Workload) -> float:
    return float((w.req_prompt + w.req_output).sum()) / w.span_s


def prepare(spec: WorkloadSpec | str | Path | dict[str, Any], fleet: Fleet | str | Path | dict[str, Any], load: float | None = None,
            seed: int | None = None, max_requests: int | None = None) -> tuple[Workload, Fleet, dict[str, Any]]:
    """The workload for this fleet. With a target ``load`` (or the spec's), the trace is
    overlaid ``target / (load of one copy)`` times, a fractional copy keeping a random share of
    its requests (``workload._replicated``), so the offered window stays the trace's at every
    load and only the arrival rate changes; a last small time scaling hits the target exactly
    (the thinning is random). With ``max_requests`` the spec's copies are kept, truncated, and
    compressed in time to the target instead."""
    spec = spec if isinstance(spec, WorkloadSpec) else load_workload_spec(spec)
    fleet = fleet if isinstance(fleet, Fleet) else load_fleet(fleet)
    if seed is not None:
        spec = replace(spec, seed=seed)
    if max_requests is not None:
        spec = replace(spec, max_requests=max_requests)
    target = load if load is not None else spec.load
    w = build_workload(spec)
    capacity = max_throughput(w, fleet)
    info: dict[str, Any] = {"capacity_tok_s": round(capacity, 1)}
    if target is not None:
        if capacity <= 0:
            raise ValueError(f"fleet {fleet.name!r} can serve none of workload {spec.name!r}: no load can be offered")
        per_copy = offered_tokens_per_s(w) / capacity / spec.replicate
        copies: float = spec.replicate
        if not spec.max_requests:
            copies = target / per_copy
            w = build_workload(spec, copies=copies)
            capacity = max_throughput(w, fleet)
        w = w.rescaled(target / (offered_tokens_per_s(w) / capacity))
        info.update(replicate=round(copies, 4), target_load=target)
    info["offered_load"] = round(offered_tokens_per_s(w) / capacity, 4)
    return w, fleet, info


def run_policy(w: Workload, fleet: Fleet, name: str, config: SimConfig = SimConfig(),
               driver: Driver | CoreDriver | None = None) -> tuple[Simulator, dict[str, Any]]:
    t0 = time.perf_counter()
    sim = Simulator(w, fleet, driver or make_driver(name, fleet), config).run()
    metrics = compute_metrics(sim)
    metrics["wall_s"] = round(time.perf_counter() - t0, 2)
    return sim, metrics


def run_all(w: Workload, fleet: Fleet, policies: list[str] | None = None, config: SimConfig = SimConfig(),
            bound: bool = True, intervals: int | None = None, series: bool = False, info: dict[str, Any] | None = None) -> dict[str, Any]:
    policies = list(policies or POLICIES)
    doc: dict[str, Any] = {"workload": w.summary(), "fleet": fleet.describe(), "seed": config.seed, **(info or {})}
    doc["offered_tok_s"] = round(offered_tokens_per_s(w), 1)
    if bound:
        doc["bound"] = deadline_bound(w, fleet, intervals)
    doc["policies"] = {}
    for name in policies:
        sim, m = run_policy(w, fleet, name, config)
        if series:
            m["series"] = compact_series(sim)
        if bound and doc["bound"]["goodput_tok_s"] > 0:
            m["goodput_vs_bound"] = round(m["goodput_tok_s"] / doc["bound"]["goodput_tok_s"], 4)
        doc["policies"][name] = m
    doc["summary"] = summary_table(doc)
    return doc


def summary_table(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per policy: goodput, ratio to bound, miss rate, cost, goodput per dollar."""
    out = []
    if "bound" in doc:
        out.append({"policy": "bound", "goodput_tok_s": round(doc["bound"]["goodput_tok_s"], 1)})
    for name, m in doc["policies"].items():
        out.append({"policy": name, "goodput_tok_s": m["goodput_tok_s"], "vs_bound": m.get("goodput_vs_bound"),
                    "miss_rate": m["miss_rate"], "cost_usd": m["cost_usd"],
                    "goodput_tokens_per_dollar": m["goodput_tokens_per_dollar"], "kv_gb_moved": round(m["kv_bytes_moved"] / 1e9, 2),
                    "wall_s": m["wall_s"]})
    return out
