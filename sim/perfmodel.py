"""Roofline performance model of one model instance (tp accelerators holding one model copy).

One engine step processes ``b`` decode tokens (one per running request, whose contexts sum
to ``sum_ctx``) plus a prefill chunk of ``c`` prompt tokens of a prompt of length ``l``:

    compute = (2 P b + 4 n_layers d_attn sum_ctx) / F_dec + (2 P c + 2 n_layers d_attn c l) / F
    bytes   = W + kv (sum_ctx + c)
    step    = slowdown * max(compute, bytes / B) + overhead

P parameters, W weight bytes, kv KV bytes per token, d_attn = heads x head_dim (the causal
prefill attention sees l/2 keys on average, decode sees the whole context), F and B the
instance's achieved FLOP/s and bytes/s: tp x datasheet peak x efficiency x tp scaling (F_dec:
the FLOP/s reached by decode's skinny matrix products, by default the same as F). The
efficiency factors are calibrated from measured profiles (``calibrate``); the router never
sees this model, only telemetry of the executions it times.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from phaseroute.sim.catalogue import Accelerator, ModelArch

TP_CHOICES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Efficiency:
    """Achieved fraction of datasheet peaks, plus a fixed per-step cost."""

    compute: float = 0.55         # model FLOP utilization reached by prefill
    decode_compute: float | None = None  # FLOP utilization of decode (None: same as compute)
    memory: float = 0.75          # fraction of peak bandwidth reached by decode
    step_overhead_s: float = 0.003  # scheduler + launch cost per engine step
    tp_scaling: float = 0.9       # throughput kept per doubling of tensor parallelism
    memory_utilization: float = 0.9  # share of device memory the engine may use


@dataclass(frozen=True)
class InstancePerf:
    """Constants of one instance's step-time formula (see module docstring)."""

    accelerator: str
    model: str
    tp: int
    flops: float          # achieved FLOP/s of the instance (prefill)
    flops_decode: float   # achieved FLOP/s of decode steps
    bandwidth: float      # achieved bytes/s of the instance
    weight_bytes: float
    kv_per_token: float
    kv_capacity: float    # bytes of KV the instance can hold
    two_p: float          # 2 x params
    dec_attn: float       # 4 x layers x d_attn  (decode attention FLOPs per context token)
    pre_attn: float       # 2 x layers x d_attn  (prefill attention FLOPs per token per prompt token)
    overhead: float
    max_batch: int

    def step_time(self, b: float, sum_ctx: float, c: float = 0.0, l_pre: float = 0.0, slowdown: float = 1.0) -> float:
        compute = (self.two_p * b + self.dec_attn * sum_ctx) / self.flops_decode
        if c:
            compute += (self.two_p + self.pre_attn * l_pre) * c / self.flops
        moved = (self.weight_bytes + self.kv_per_token * (sum_ctx + c)) / self.bandwidth
        return slowdown * (compute if compute > moved else moved) + self.overhead

    def decode_tokens_per_s(self, batch: int, context: float) -> float:
        return batch / self.step_time(batch, batch * context)

    def prefill_tokens_per_s(self, prompt: float, chunk: float | None = None) -> float:
        c = min(prompt, chunk or prompt)
        return c / self.step_time(0, 0, c, prompt)

    def max_tokens_in_kv(self) -> float:
        return self.kv_capacity / self.kv_per_token


def auto_tp(acc: Accelerator, model: ModelArch, eff: Efficiency = Efficiency()) -> int:
    """Smallest tensor-parallel degree leaving at least a quarter of usable memory for KV."""
    weights = model.weight_bytes(acc.bytes_per_element)
    for tp in TP_CHOICES:
        usable = tp * acc.memory_bytes * eff.memory_utilization
        if usable - weights >= 0.25 * usable:
            return tp
    raise ValueError(f"model {model.name} ({weights / 1e9:.0f} GB) does not fit 8 x {acc.name}")


def instance_perf(acc: Accelerator, model: ModelArch, tp: int | None = None,
                  eff: Efficiency = Efficiency(), max_batch: int = 256) -> InstancePerf:
    tp = tp or auto_tp(acc, model, eff)
    scale = tp * eff.tp_scaling ** math.log2(tp)
    bpe = acc.bytes_per_element
    weights = model.weight_bytes(bpe)
    return InstancePerf(
        accelerator=acc.name, model=model.name, tp=tp,
        flops=acc.peak_flops * eff.compute * scale,
        flops_decode=acc.peak_flops * (eff.decode_compute or eff.compute) * scale,
        bandwidth=acc.mem_bandwidth * eff.memory * scale,
        weight_bytes=weights,
        kv_per_token=model.kv_bytes_per_token(bpe),
        kv_capacity=max(tp * acc.memory_bytes * eff.memory_utilization - weights, 0.0),
        two_p=2.0 * model.params,
        dec_attn=4.0 * model.layers * model.attn_dim,
        pre_attn=2.0 * model.layers * model.attn_dim,
        overhead=eff.step_overhead_s,
        max_batch=max_batch,
    )


def datasheet_perf(acc: Accelerator, model: ModelArch, tp: int | None = None, max_batch: int = 256) -> InstancePerf:
    """What the datasheet promises: full peak FLOP/s and bandwidth, no overhead, no tp loss."""
    ideal = Efficiency(compute=1.0, memory=1.0, step_overhead_s=0.0, tp_scaling=1.0)
    return instance_perf(acc, model, tp or auto_tp(acc, model), ideal, max_batch)
