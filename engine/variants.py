"""Pool variants: one backend, configured differently, measurably different on the same CPU.

=============  ==========  ========  ===========================================================
variant        activations KV dtype  weights
=============  ==========  ========  ===========================================================
fp32           float32     float32   float32 (the reference; bit-identical to ``generate()``)
bf16           bfloat16    bfloat16  bfloat16 (fast where the CPU has AVX512-BF16/AMX, slow else)
int8-dynamic   float32     float32   int8 per-tensor, activations quantized per call
                                     (``torch.ao`` dynamic quantization: faster decode, real
                                     quality loss; CPU only)
int8-weight    bfloat16    bfloat16  int8 per-output-channel, dequantized inside
                                     ``aten._weight_int8pack_mm`` (4x smaller weights, small drift)
=============  ==========  ========  ===========================================================

``threads`` (torch intra-op threads) is part of a pool's configuration too. A variant is
plain data (``VariantConfig``); ``apply_variant`` turns an fp32 model into that variant.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any

from phaseroute.engine.errors import BackendUnavailableError, UnknownNameError


@dataclass(frozen=True)
class VariantConfig:
    """How one pool runs the model."""

    name: str
    dtype: str = "float32"  # activation and KV dtype
    quantization: str | None = None  # None | "int8-dynamic" | "int8-weight"
    threads: int = 2  # torch.set_num_threads for the executing process
    device: str = "cpu"  # "cpu" | "cuda" | "cuda:N"

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"variant {self.name!r}: dtype {self.dtype!r} not in float32/bfloat16/float16")
        if self.quantization not in (None, "int8-dynamic", "int8-weight"):
            raise ValueError(f"variant {self.name!r}: quantization {self.quantization!r} is unknown")
        if self.threads < 1:
            raise ValueError(f"variant {self.name!r}: threads={self.threads} must be >= 1")
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise ValueError(f"variant {self.name!r}: device {self.device!r} is not cpu or cuda[:N]")


VARIANTS: dict[str, VariantConfig] = {
    "fp32": VariantConfig("fp32"),
    "bf16": VariantConfig("bf16", dtype="bfloat16"),
    "int8-dynamic": VariantConfig("int8-dynamic", quantization="int8-dynamic"),
    "int8-weight": VariantConfig("int8-weight", dtype="bfloat16", quantization="int8-weight"),
}


def variant_config(name: str, threads: int | None = None, device: str | None = None) -> VariantConfig:
    """The named variant with optional thread/device overrides."""
    if name not in VARIANTS:
        raise UnknownNameError(f"unknown variant {name!r}; known variants: {sorted(VARIANTS)}")
    config = VARIANTS[name]
    if threads is not None:
        config = replace(config, threads=threads)
    if device is not None:
        config = replace(config, device=device)
    return config


def apply_variant(model: Any, variant: VariantConfig) -> Any:
    """Cast/quantize an fp32 model (in place where possible) and move it to the device."""
    import torch

    if variant.quantization == "int8-dynamic":
        if variant.device != "cpu":
            raise BackendUnavailableError(f"variant {variant.name!r}: int8-dynamic runs on cpu only, not {variant.device!r}")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao deprecation notice
            # torch.ao.quantization.quantize_dynamic has no annotations (a torch typing gap)
            return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)  # type: ignore[no-untyped-call]
    model = model.to(device=variant.device, dtype=getattr(torch, variant.dtype))
    if variant.quantization == "int8-weight":
        _swap_linears(model)
    return model


def _swap_linears(module: Any) -> None:
    import torch

    from phaseroute.engine.int8_linear import WeightOnlyInt8Linear

    for name, child in module.named_children():
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, WeightOnlyInt8Linear.from_linear(child))
        else:
            _swap_linears(child)
