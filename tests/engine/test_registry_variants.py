"""Registry, lazy imports and variants."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from phaseroute.engine.errors import BackendUnavailableError, UnknownNameError
from phaseroute.engine.protocol import PrefillItem
from phaseroute.engine.registry import BACKENDS, build_executor
from phaseroute.engine.variants import VARIANTS, variant_config


def test_import_engine_does_not_import_torch_or_vllm() -> None:
    code = (
        "import sys, phaseroute.engine as e, phaseroute.engine.registry, phaseroute.engine.variants\n"
        "assert e.VARIANTS and e.BACKENDS\n"
        "print('torch' in sys.modules, 'vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_vllm_backend_is_registered_but_explains_itself() -> None:
    assert "vllm" in BACKENDS
    with pytest.raises(BackendUnavailableError, match="vllm"):
        build_executor("tiny-llama", "fp32", backend="vllm")


@pytest.mark.parametrize(
    "kwargs,name",
    [({"backend": "tpu"}, "tpu"), ({"variant": "fp8"}, "fp8"), ({"model": "gpt-9"}, "gpt-9")],
)
def test_unknown_names_list_the_known_ones(kwargs: dict[str, str], name: str) -> None:
    with pytest.raises(UnknownNameError, match=f"'{name}'.*known"):
        build_executor(**{"model": "tiny-llama", **kwargs})


def test_variant_validation_names_bad_values() -> None:
    assert set(VARIANTS) == {"fp32", "bf16", "int8-dynamic", "int8-weight"}
    assert variant_config("bf16", threads=1).threads == 1
    with pytest.raises(ValueError, match="threads=0"):
        variant_config("fp32", threads=0)
    with pytest.raises(ValueError, match="'tpu'"):
        variant_config("fp32", device="tpu")


def test_variants_really_differ_on_the_tiny_model() -> None:
    ids = tuple((5 * i) % 500 + 3 for i in range(24))
    logits = {}
    for name in VARIANTS:
        ex = build_executor("tiny-llama", name, threads=1)
        [res] = ex.prefill([PrefillItem("a", 2, token_ids=ids, return_logprobs=5)])
        logits[name] = res.first_logprobs
        expected = "float32" if name in ("fp32", "int8-dynamic") else "bfloat16"
        assert res.kv.meta.dtype == expected and res.kv.keys[0].dtype == getattr(torch, expected)
        assert ex.kv_bytes_per_token() == 2 * 2 * 2 * 16 * (4 if expected == "float32" else 2)
    ref = logits["fp32"].top_logprobs
    for name in ("bf16", "int8-dynamic", "int8-weight"):
        assert logits[name].top_logprobs != ref, name


def test_weight_only_int8_linear_is_close_to_fp32() -> None:
    from phaseroute.engine.int8_linear import WeightOnlyInt8Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 32).to(torch.bfloat16)
    q = WeightOnlyInt8Linear.from_linear(linear)
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(q(x).float(), linear(x).float(), atol=0.05, rtol=0.05)
    assert q.qweight.dtype == torch.int8
