"""Catalogue sanity and the roofline against hand calculations."""

from __future__ import annotations

import pytest

from phaseroute.sim.catalogue import load_catalogue
from phaseroute.sim.perfmodel import Efficiency, auto_tp, instance_perf


def test_catalogue_entries_are_sane():
    cat = load_catalogue()
    for name in ("H100-SXM-80GB", "A100-SXM-80GB", "A100-SXM-40GB", "L40S", "L4", "A10G", "T4", "V100-SXM2-32GB"):
        a = cat.accelerators[name]
        assert a.source and "datasheet" in a.source.lower()
        assert 10e12 < a.peak_flops < 2e15 and 100e9 < a.mem_bandwidth < 5e12 and a.price_per_hour > 0
    # datasheet figures (dense 16-bit) and the generation order the split baseline relies on
    assert cat.accelerators["H100-SXM-80GB"].peak_flops == pytest.approx(989.4e12)
    assert cat.accelerators["A100-SXM-40GB"].mem_bandwidth == pytest.approx(1555e9)
    assert cat.accelerators["T4"].dtype == "fp16"
    assert cat.accelerators["H100-SXM-80GB"].generation > cat.accelerators["A100-SXM-80GB"].generation
    m = cat.models["llama-3-8b"]
    assert m.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131072
    assert cat.models["llama-3-70b"].kv_bytes_per_token(2) == 327680
    assert cat.models["qwen2.5-7b"].kv_bytes_per_token(2) == 57344
    for arch in cat.models.values():   # ~12 L d^2 of transformer blocks, within 2x of the stated size
        assert 0.4 < 12 * arch.layers * arch.hidden ** 2 / arch.params < 1.6


def test_user_catalogue_overrides(tmp_path):
    extra = tmp_path / "mine.yaml"
    extra.write_text("accelerators:\n  H100-SXM-80GB: {memory_gb: 80, peak_tflops: 989.4, mem_bandwidth_gb_s: 3350, price_per_hour: 2.5}\n")
    assert load_catalogue(extra).accelerators["H100-SXM-80GB"].price_per_hour == 2.5


def test_roofline_by_hand():
    cat = load_catalogue()
    h100, llama = cat.accelerators["H100-SXM-80GB"], cat.models["llama-3-8b"]
    eff = Efficiency(compute=0.5, memory=0.8, step_overhead_s=0.002)
    p = instance_perf(h100, llama, 1, eff)
    F, B = 989.4e12 * 0.5, 3350e9 * 0.8
    W, kv = 8.03e9 * 2, 131072
    # decode, batch 1, context 1000: memory-bound
    assert p.step_time(1, 1000) == pytest.approx((W + kv * 1000) / B + 0.002)
    # decode, batch 256 at 1000 tokens each: bytes 16.06 GB + 33.6 GB vs FLOPs 4.1 T + 0.13 T
    flops = 2 * 8.03e9 * 256 + 4 * 32 * 4096 * 256 * 1000
    assert p.step_time(256, 256 * 1000) == pytest.approx(max(flops / F, (W + kv * 256_000) / B) + 0.002)
    # prefill of one 2,048-token prompt: compute-bound, causal attention on l/2 keys per token
    flops = 2048 * (2 * 8.03e9 + 2 * 32 * 4096 * 2048)
    assert p.step_time(0, 0, 2048, 2048) == pytest.approx(flops / F + 0.002)
    assert flops / F > (W + kv * 2048) / B
    assert p.prefill_tokens_per_s(2048) == pytest.approx(2048 / (flops / F + 0.002))
    # 4x slower pool: every step 4x longer before the overhead
    assert p.step_time(1, 1000, slowdown=4) == pytest.approx(4 * (W + kv * 1000) / B + 0.002)
    # KV capacity: 90% of 80 GB minus the weights
    assert p.kv_capacity == pytest.approx(0.9 * 80e9 - W)
    assert auto_tp(cat.accelerators["T4"], llama) == 2
    assert auto_tp(h100, cat.models["llama-3-70b"]) == 4
