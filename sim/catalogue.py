"""Accelerator and model catalogues (package data under ``sim/data``), loadable and extendable.

``load_catalogue()`` reads the bundled accelerators.yaml and models.yaml; a user catalogue
file (same layout, either or both top-level keys) adds or overrides entries.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from phaseroute.sim.errors import SpecError
from phaseroute.sim.specio import DATA_DIR, Fields, load_spec

BYTES_PER_ELEMENT = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class Accelerator:
    """Datasheet figures of one accelerator (per device)."""

    name: str
    memory_bytes: float
    peak_flops: float          # dense 16-bit tensor FLOP/s
    mem_bandwidth: float       # bytes/s
    intra_node_bandwidth: float  # bytes/s (NVLink / PCIe), used for tensor parallelism
    network_bandwidth: float   # bytes/s per device, for KV transfers between pools
    price_per_hour: float
    mtbf_hours: float
    generation: int
    dtype: str
    source: str

    @property
    def bytes_per_element(self) -> int:
        return BYTES_PER_ELEMENT[self.dtype]


@dataclass(frozen=True)
class ModelArch:
    """The shape of a transformer, enough for a roofline."""

    name: str
    params: float
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    context_tokens: int
    source: str

    def kv_bytes_per_token(self, bytes_per_element: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * bytes_per_element

    def weight_bytes(self, bytes_per_element: int) -> float:
        return self.params * bytes_per_element

    @property
    def attn_dim(self) -> int:
        """Query heads x head dim: the width attention FLOPs scale with."""
        return self.heads * self.head_dim


@dataclass(frozen=True)
class Catalogue:
    accelerators: dict[str, Accelerator]
    models: dict[str, ModelArch]

    def accelerator(self, name: str, where: str = "") -> Accelerator:
        try:
            return self.accelerators[name]
        except KeyError:
            raise SpecError(f"{where}unknown accelerator {name!r}; known: {sorted(self.accelerators)}") from None

    def model(self, name: str, where: str = "") -> ModelArch:
        try:
            return self.models[name]
        except KeyError:
            raise SpecError(f"{where}unknown model {name!r}; known: {sorted(self.models)}") from None

    def merged(self, other: Catalogue) -> Catalogue:
        return Catalogue({**self.accelerators, **other.accelerators}, {**self.models, **other.models})


def _accelerator(name: str, f: Fields) -> Accelerator:
    f.unknown({"memory_gb", "peak_tflops", "mem_bandwidth_gb_s", "intra_node_gb_s", "network_gbit_s",
               "price_per_hour", "mtbf_hours", "generation", "dtype", "source"})
    return Accelerator(
        name=name,
        memory_bytes=f.num("memory_gb", lo=0, strict_lo=True) * 1e9,
        peak_flops=f.num("peak_tflops", lo=0, strict_lo=True) * 1e12,
        mem_bandwidth=f.num("mem_bandwidth_gb_s", lo=0, strict_lo=True) * 1e9,
        intra_node_bandwidth=f.num("intra_node_gb_s", 64, lo=0, strict_lo=True) * 1e9,
        network_bandwidth=f.num("network_gbit_s", 10, lo=0, strict_lo=True) * 1e9 / 8,
        price_per_hour=f.num("price_per_hour", lo=0),
        mtbf_hours=f.num("mtbf_hours", 50000, lo=0, strict_lo=True),
        generation=f.int("generation", 2020),
        dtype=f.str("dtype", "bf16", choices=tuple(BYTES_PER_ELEMENT)),
        source=f.str("source", "unspecified"),
    )


def _model(name: str, f: Fields) -> ModelArch:
    f.unknown({"params", "layers", "heads", "kv_heads", "head_dim", "hidden", "context_tokens", "source"})
    return ModelArch(
        name=name,
        params=f.num("params", lo=1, strict_lo=True),
        layers=f.int("layers", lo=1),
        heads=f.int("heads", lo=1),
        kv_heads=f.int("kv_heads", lo=1),
        head_dim=f.int("head_dim", lo=1),
        hidden=f.int("hidden", lo=1),
        context_tokens=f.int("context_tokens", 8192, lo=1),
        source=f.str("source", "unspecified"),
    )


def parse_catalogue(data: dict[str, Any], where: str) -> Catalogue:
    top = Fields(data, where)
    top.unknown({"accelerators", "models"})
    accs = top.sub("accelerators", {})
    models = top.sub("models", {})
    return Catalogue(
        {n: _accelerator(n, Fields(v, f"{where}: accelerators.{n}")) for n, v in accs.data.items()},
        {n: _model(n, Fields(v, f"{where}: models.{n}")) for n, v in models.data.items()},
    )


def load_catalogue(extra: str | Path | dict[str, Any] | None = None) -> Catalogue:
    """The bundled catalogue, plus (overriding) the entries of ``extra`` if given."""
    base = parse_catalogue(load_spec(DATA_DIR / "accelerators.yaml", "catalogue")[0], "accelerators.yaml")
    base = base.merged(parse_catalogue(load_spec(DATA_DIR / "models.yaml", "catalogue")[0], "models.yaml"))
    if extra is None:
        return base
    data, path = load_spec(extra, "catalogue")
    return base.merged(parse_catalogue(data, str(path or "<catalogue>")))


def with_price(acc: Accelerator, price: float | None) -> Accelerator:
    return acc if price is None else replace(acc, price_per_hour=price)
