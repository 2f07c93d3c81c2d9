"""Fleet specs: pools of accelerators, the models they hold, links between pools, events.

A fleet spec (YAML or JSON)::

    name: h100-a100
    efficiency: {compute: 0.55, memory: 0.75, step_overhead_ms: 3}   # defaults for every pool
    engine: {max_batch: 256, prefill_chunk: 8192, mixed_chunk: 2048}
    failures: true             # random accelerator failures drawn from each pool's MTBF
    transfer_usd_per_gb: 0.02  # optional: price of KV moved between two pools (default 0: one site, no
                               # egress charge); charged per GB moved, seen by the phaseroute router
    pools:
      - name: h100
        accelerator: H100-SXM-80GB     # a catalogue name
        count: 16                      # accelerators
        models: [llama-3-8b]           # or {llama-3-8b: 0.75, llama-3-70b: 0.25} (share of the pool)
        tp: 1                          # optional; default: smallest degree leaving >= 25% memory for KV
        phases: [prefill, decode]      # optional restriction
        price_per_hour: 12.29          # optional override of the catalogue price (per accelerator)
        mtbf_hours: 50000              # optional override
        repair_minutes: 30
        efficiency: {compute: 0.5}     # optional per-pool override
    links:                             # optional; default: min of both pools' summed network bandwidth
      - {from: h100, to: a100, bandwidth_gbit_s: 400, latency_ms: 0.5}
    events:
      - {at_s: 1800, pool: h100, kind: slowdown, factor: 4}   # steps take 4x longer from then on
      - {at_s: 2400, pool: a100, kind: loss}                  # the pool disappears

A pool holding several models becomes one simulated pool per model, named ``pool/model``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from phaseroute.schemas.enums import Phase
from phaseroute.sim.catalogue import Accelerator, Catalogue, load_catalogue
from phaseroute.sim.errors import SpecError
from phaseroute.sim.perfmodel import Efficiency, InstancePerf, auto_tp, datasheet_perf, instance_perf
from phaseroute.sim.specio import Fields, load_spec

PHASES = (Phase.PREFILL, Phase.DECODE)   # a pool serves both unless its spec restricts it
EVENT_KINDS = ("slowdown", "loss", "restore")


@dataclass(frozen=True)
class EngineLimits:
    max_batch: int = 256        # running decode requests per instance
    prefill_chunk: int = 8192   # prompt tokens per step when no decode runs
    mixed_chunk: int = 2048     # prompt tokens per step beside running decodes (chunked prefill)


@dataclass(frozen=True)
class SimPool:
    """One simulated pool: ``instances`` copies of one model, each on ``perf.tp`` accelerators."""

    name: str
    parent: str
    accelerator: Accelerator
    model: str
    accelerators: int
    instances: int
    perf: InstancePerf
    datasheet: InstancePerf
    phases: tuple[Phase, ...]
    price_per_hour: float      # per accelerator
    mtbf_hours: float
    repair_s: float
    variant: str
    context_tokens: int = 131072   # the model's context length (prompt + output)

    @property
    def cost_per_hour(self) -> float:
        return self.accelerators * self.price_per_hour


@dataclass(frozen=True)
class Link:
    src: str      # parent pool names
    dst: str
    bandwidth: float  # bytes/s
    latency_s: float


@dataclass(frozen=True)
class FleetEvent:
    at_s: float
    pool: str     # parent pool name
    kind: str
    factor: float = 1.0


@dataclass(frozen=True)
class Fleet:
    name: str
    pools: tuple[SimPool, ...]
    links: dict[tuple[str, str], Link]
    events: tuple[FleetEvent, ...]
    failures: bool
    limits: EngineLimits
    source: str = "<inline>"
    parents: dict[str, tuple[str, ...]] = field(default_factory=dict)
    transfer_usd_per_gb: float = 0.0   # dollars per GB of KV moved between two pools

    def transfer_cost_usd(self, kv_bytes: float) -> float:
        return kv_bytes / 1e9 * self.transfer_usd_per_gb

    @property
    def cost_per_hour(self) -> float:
        return sum(p.cost_per_hour for p in self.pools)

    @property
    def accelerators(self) -> int:
        return sum(p.accelerators for p in self.pools)

    def pool(self, name: str) -> SimPool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)

    def link(self, src: SimPool, dst: SimPool) -> Link:
        return self.links[(src.parent, dst.parent)]

    def models(self) -> set[str]:
        return {p.model for p in self.pools}

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name, "accelerators": self.accelerators, "cost_per_hour": round(self.cost_per_hour, 2),
            "transfer_usd_per_gb": self.transfer_usd_per_gb,
            "pools": [{"name": p.name, "accelerator": p.accelerator.name, "accelerators": p.accelerators,
                       "model": p.model, "tp": p.perf.tp, "instances": p.instances, "phases": [ph.slug for ph in p.phases],
                       "kv_capacity_tokens": int(p.perf.max_tokens_in_kv()), "context_tokens": p.context_tokens}
                      for p in self.pools],
            "events": [e.__dict__ for e in self.events],
        }


def _efficiency(f: Fields, base: Efficiency) -> Efficiency:
    f.unknown({"compute", "decode_compute", "memory", "step_overhead_ms", "tp_scaling", "memory_utilization"})
    return Efficiency(
        compute=f.num("compute", base.compute, lo=0, hi=1, strict_lo=True),
        decode_compute=(f.num("decode_compute", lo=0, hi=1, strict_lo=True) if f.has("decode_compute")
                        else base.decode_compute),
        memory=f.num("memory", base.memory, lo=0, hi=1, strict_lo=True),
        step_overhead_s=f.num("step_overhead_ms", base.step_overhead_s * 1e3, lo=0) / 1e3,
        tp_scaling=f.num("tp_scaling", base.tp_scaling, lo=0, hi=1, strict_lo=True),
        memory_utilization=f.num("memory_utilization", base.memory_utilization, lo=0, hi=1, strict_lo=True),
    )


def _models(f: Fields) -> dict[str, float]:
    value = f.raw("models")
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return {m: 1.0 / len(value) for m in value}
    if isinstance(value, dict) and value:
        shares = {str(k): Fields(value, f"{f.where}.models").num(k, lo=0, hi=1, strict_lo=True) for k in value}
        if sum(shares.values()) > 1.0 + 1e-9:
            raise SpecError(f"{f.where}: models shares add up to {sum(shares.values())} > 1")
        return shares
    raise SpecError(f"{f.where}: field 'models' must be a model name, a list of names or {{name: share}}, got {value!r}")


def _pools(f: Fields, cat: Catalogue, eff: Efficiency, limits: EngineLimits, variant_default: str) -> list[SimPool]:
    f.unknown({"name", "accelerator", "count", "models", "tp", "phases", "price_per_hour", "mtbf_hours",
               "repair_minutes", "efficiency", "variant"})
    name = f.str("name")
    if "/" in name:
        raise SpecError(f"{f.where}: pool name {name!r} must not contain '/'")
    acc = cat.accelerator(f.str("accelerator"), f"{f.where}: ")
    count = f.int("count", lo=1)
    phases = f.phases("phases", [p.slug for p in PHASES])
    pool_eff = _efficiency(f.sub("efficiency", {}), eff)
    price = f.num("price_per_hour", acc.price_per_hour, lo=0)
    models = _models(f)
    out = []
    for model_name, share in models.items():
        arch = cat.model(model_name, f"{f.where}: ")
        try:
            tp = f.int("tp", lo=1) if f.has("tp") and f.raw("tp") != "auto" else auto_tp(acc, arch, pool_eff)
        except ValueError as exc:
            raise SpecError(f"{f.where}: {exc}") from None
        accs = int(round(count * share))
        instances = accs // tp
        if instances < 1:
            raise SpecError(f"{f.where}: {accs} x {acc.name} cannot hold one copy of {model_name} (needs tp={tp})")
        perf = instance_perf(acc, arch, tp, pool_eff, limits.max_batch)
        if perf.kv_capacity <= 0:
            raise SpecError(f"{f.where}: {model_name} leaves no KV memory on {tp} x {acc.name}")
        out.append(SimPool(
            name=name if len(models) == 1 else f"{name}/{model_name}", parent=name, accelerator=acc,
            model=model_name, accelerators=instances * tp, instances=instances, perf=perf,
            datasheet=datasheet_perf(acc, arch, tp, limits.max_batch), phases=phases, price_per_hour=price,
            mtbf_hours=f.num("mtbf_hours", acc.mtbf_hours, lo=0, strict_lo=True),
            repair_s=f.num("repair_minutes", 30, lo=0) * 60, variant=f.str("variant", variant_default),
            context_tokens=arch.context_tokens,
        ))
    return out


def _links(top: Fields, pools: list[SimPool]) -> dict[tuple[str, str], Link]:
    nic: dict[str, float] = {}
    for p in pools:
        nic[p.parent] = nic.get(p.parent, 0.0) + p.accelerators * p.accelerator.network_bandwidth
    links = {(a, b): Link(a, b, min(nic[a], nic[b]), 0.0005) for a in nic for b in nic if a != b}
    for i, raw in enumerate(top.raw("links", []) or []):
        f = Fields(raw, f"{top.where}.links[{i}]")
        f.unknown({"from", "to", "bandwidth_gbit_s", "latency_ms", "both_ways"})
        a, b = f.str("from"), f.str("to")
        for end in (a, b):
            if end not in nic:
                raise SpecError(f"{f.where}: unknown pool {end!r}; pools: {sorted(nic)}")
        link = Link(a, b, f.num("bandwidth_gbit_s", lo=0, strict_lo=True) * 1e9 / 8, f.num("latency_ms", 0.5, lo=0) / 1e3)
        links[(a, b)] = link
        if f.raw("both_ways", True):
            links[(b, a)] = Link(b, a, link.bandwidth, link.latency_s)
    return links


def _events(top: Fields, parents: set[str]) -> tuple[FleetEvent, ...]:
    out = []
    for i, raw in enumerate(top.raw("events", []) or []):
        f = Fields(raw, f"{top.where}.events[{i}]")
        f.unknown({"at_s", "pool", "kind", "factor"})
        pool = f.str("pool")
        if pool not in parents:
            raise SpecError(f"{f.where}: unknown pool {pool!r}; pools: {sorted(parents)}")
        kind = f.str("kind", choices=EVENT_KINDS)
        factor = f.num("factor", 1.0, lo=0, strict_lo=True) if kind == "slowdown" else 1.0
        out.append(FleetEvent(f.num("at_s", lo=0), pool, kind, factor))
    return tuple(sorted(out, key=lambda e: e.at_s))


def parse_fleet(data: dict[str, Any], where: str = "<fleet>", catalogue: Catalogue | None = None) -> Fleet:
    cat = catalogue or load_catalogue()
    top = Fields(data, where)
    top.unknown({"name", "efficiency", "engine", "failures", "pools", "links", "events", "variant", "description",
                 "transfer_usd_per_gb"})
    eff = _efficiency(top.sub("efficiency", {}), Efficiency())
    eng = top.sub("engine", {})
    eng.unknown({"max_batch", "prefill_chunk", "mixed_chunk"})
    limits = EngineLimits(eng.int("max_batch", 256, lo=1), eng.int("prefill_chunk", 8192, lo=1), eng.int("mixed_chunk", 2048, lo=1))
    raw_pools = top.raw("pools")
    if not isinstance(raw_pools, list) or not raw_pools:
        raise SpecError(f"{where}: field 'pools' must be a non-empty list")
    pools: list[SimPool] = []
    for i, raw in enumerate(raw_pools):
        pools.extend(_pools(Fields(raw, f"{where}: pools[{i}]"), cat, eff, limits, top.str("variant", "default")))
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise SpecError(f"{where}: duplicate pool names {sorted(n for n in names if names.count(n) > 1)}")
    parents: dict[str, tuple[str, ...]] = {}
    for p in pools:
        parents[p.parent] = parents.get(p.parent, ()) + (p.name,)
    return Fleet(
        name=top.str("name", Path(where).stem), pools=tuple(pools), links=_links(top, pools),
        events=_events(top, set(parents)), failures=bool(top.raw("failures", True)), limits=limits,
        source=where, parents=parents, transfer_usd_per_gb=top.num("transfer_usd_per_gb", 0.0, lo=0),
    )


def load_fleet(ref: str | Path | dict[str, Any], catalogue: Catalogue | None = None) -> Fleet:
    data, path = load_spec(ref, "fleet")
    return parse_fleet(data, str(path) if path else "<fleet>", catalogue)


def with_events(fleet: Fleet, events: list[FleetEvent]) -> Fleet:
    return replace(fleet, events=tuple(sorted(list(fleet.events) + events, key=lambda e: e.at_s)))


def with_transfer_price(fleet: Fleet, usd_per_gb: float) -> Fleet:
    """The same fleet with KV moved between pools charged ``usd_per_gb``."""
    if not (usd_per_gb >= 0.0 and usd_per_gb != float("inf")):
        raise ValueError(f"transfer price must be a finite number of dollars per GB >= 0, got {usd_per_gb!r}")
    return replace(fleet, transfer_usd_per_gb=float(usd_per_gb))
