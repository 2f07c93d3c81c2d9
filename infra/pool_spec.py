"""Pool specs: which pools a stack runs, each with its phase, engine variant, threads and workers.

One grammar, used by ``phaseroute up --pools``, its help, its errors and the README::

    NAME=PHASE:VARIANT[:THREADS][xWORKERS],...
    prefill-fp32=prefill:fp32,decode-int8=decode:int8-dynamic:2,colo-fp32=both:fp32x2

PHASE is prefill, decode or both (colocated); VARIANT one of the engine's variants; THREADS the
torch threads of each worker; WORKERS how many workers the pool starts. What a pool leaves out
comes from ``consumers.machine.plan_pools`` over the cores this process may use: the workers
of the pools that prefill together use each core once (on 2 cores, a prefill pool and a colocated
pool get 1 worker x 1 thread each; on 16 cores, one pool gets 16 workers x 1 thread), and the
decode-only pools beside them are planned over every core again, at a lower CPU priority (nice
10: prefill first). A YAML file with the same fields per pool name works too, ``nice`` among them::

    colo-fp32: {phase: both, variant: fp32, threads: 1, workers: 2}
    decode-int8: {phase: decode, variant: int8-dynamic, workers: 2, nice: 10}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from phaseroute.infra import topics

PHASES = ("prefill", "decode", "both")
POOL_SPEC_FORM = "NAME=PHASE:VARIANT[:THREADS][xWORKERS]"
POOL_SPEC_EXAMPLE = "prefill-fp32=prefill:fp32,decode-int8=decode:int8-dynamic:2,colo-fp32=both:fp32x2"
_ONE_POOL = re.compile(r"^(?P<name>[^=\s]+)=(?P<phase>[a-z]+):(?P<variant>[a-z0-9-]+?)(?::(?P<threads>\d+))?(?:x(?P<workers>\d+))?$")


def _variants() -> tuple[str, ...]:
    from phaseroute.engine.variants import VARIANTS  # plain data: no torch import

    return tuple(VARIANTS)


@dataclass(frozen=True)
class PoolSpec:
    """One pool of a stack: its workers all run ``phase`` with ``variant`` on ``threads`` threads."""

    name: str
    phase: str
    variant: str = "fp32"
    threads: int = 1  # parse_pools plans what a spec leaves out; code that builds a PoolSpec says what it wants
    workers: int = 1
    max_decode_batch: int = 16
    nice: int = 0  # the workers' CPU priority (0 normal .. 19 lowest; plan_pools: decode pools beside prefilling ones)

    def __post_init__(self) -> None:
        topics.check_pool_name(self.name)
        if self.phase not in PHASES:
            raise ValueError(f"pool {self.name!r}: phase {self.phase!r} must be one of {', '.join(PHASES)}")
        if self.variant not in _variants():
            raise ValueError(f"pool {self.name!r}: variant {self.variant!r} must be one of {', '.join(_variants())}")
        for name in ("threads", "workers", "max_decode_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"pool {self.name!r}: {name} {value!r} must be a whole number >= 1")
        if not isinstance(self.nice, int) or isinstance(self.nice, bool) or not 0 <= self.nice <= 19:
            raise ValueError(f"pool {self.name!r}: nice {self.nice!r} must be a whole number 0-19")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _bad(part: str, why: str) -> ValueError:
    return ValueError(f"pool spec {part!r}: {why}; the form is {POOL_SPEC_FORM}, e.g. {POOL_SPEC_EXAMPLE}")


def _parse_one(part: str) -> tuple[str, dict[str, Any]]:
    """One ``NAME=PHASE:VARIANT[:THREADS][xWORKERS]``: (the part, its fields; threads and workers None when left out)."""
    match = _ONE_POOL.match(part)
    if match is None:
        raise _bad(part, "no '=' after the pool name" if "=" not in part else "not in that form")
    return part, {"name": match["name"], "phase": match["phase"], "variant": match["variant"],
                  "threads": None if match["threads"] is None else int(match["threads"]),
                  "workers": None if match["workers"] is None else int(match["workers"])}


def parse_pools(spec: str, cores: int | None = None) -> list[PoolSpec]:
    """Pools from ``NAME=PHASE:VARIANT[:THREADS][xWORKERS],...`` or from a YAML file path; threads
    and workers a pool leaves out are planned for ``cores`` (default: the cores this process may use)."""
    path = Path(spec)
    if path.suffix in (".yaml", ".yml", ".json"):
        if not path.exists():
            raise ValueError(f"pool file {spec!r} does not exist")
        parts = _from_file(path)
    else:
        parts = [_parse_one(p) for p in (p.strip() for p in spec.split(",")) if p]
    if not parts:
        raise ValueError(f"pool spec {spec!r} names no pool; the form is {POOL_SPEC_FORM}, e.g. {POOL_SPEC_EXAMPLE}")
    names = [given["name"] for _, given in parts]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"pool spec {spec!r} names pool(s) {', '.join(twice)} more than once")
    return _planned(parts, cores)


def _planned(parts: list[tuple[str, dict[str, Any]]], cores: int | None) -> list[PoolSpec]:
    """PoolSpecs with the threads and workers ``plan_pools`` gives where a part names none
    (each part is (where it came from, for errors; its fields))."""
    from phaseroute.consumers.machine import plan_pools, usable_cores

    fixed = {i: given["workers"] for i, (_, given) in enumerate(parts)
             if isinstance(given.get("workers"), int) and not isinstance(given["workers"], bool) and given["workers"] >= 1}
    threads = {i: given["threads"] for i, (_, given) in enumerate(parts)
               if isinstance(given.get("threads"), int) and not isinstance(given["threads"], bool) and given["threads"] >= 1}
    shares = plan_pools([str(given.get("phase")) for _, given in parts], usable_cores() if cores is None else cores, fixed, threads)
    pools = []
    for (where, given), share in zip(parts, shares, strict=True):
        planned = {"threads": share.threads, "workers": share.workers, "nice": share.nice}
        try:
            pools.append(PoolSpec(**{**given, **{k: v for k, v in planned.items() if given.get(k) is None}}))
        except (TypeError, ValueError) as exc:
            if where.startswith("pool file "):
                raise ValueError(f"{where}: {exc}") from None
            raise _bad(where, str(exc)) from None
    return pools


def _from_file(path: Path) -> list[tuple[str, dict[str, Any]]]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or not data:
        raise ValueError(f"pool file {path}: expected a mapping of pool name -> {{phase, variant, threads, workers}}")
    allowed = {f.name for f in fields(PoolSpec)} - {"name"}
    pools = []
    for name, given in data.items():
        if not isinstance(given, dict):
            raise ValueError(f"pool file {path}: pool {name!r} must map to fields {sorted(allowed)}, got {given!r}")
        unknown = sorted(set(given) - allowed)
        if unknown:
            raise ValueError(f"pool file {path}: pool {name!r} has unknown field(s) {unknown}; known: {sorted(allowed)}")
        pools.append((f"pool file {path}: pool {name!r}", {"name": str(name), **given}))
    return pools
