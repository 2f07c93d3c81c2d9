"""Model executors (torch/transformers; vLLM optional and lazily imported), KV codec and stores, profiler.

Typical use (names are re-exported lazily, so ``import phaseroute.engine`` does not import torch)::

    from phaseroute.engine import build_executor, PrefillItem, DecodeRequest, kv_codec, open_store

    ex = build_executor(model="smollm2-135m", variant="fp32", threads=2, device="cpu")
    [res] = ex.prefill([PrefillItem("r1", max_tokens=32, messages=({"role": "user", "content": "Hi"},))])
    store = open_store()                                   # settings().kv_store
    location = store.put("r1/0", kv_codec.encode_parts(res.kv))
    kv = kv_codec.decode(store.get(location))              # KVIntegrityError if corrupted
    session = ex.decode_session(max_batch=32)
    session.add(DecodeRequest("r1", kv, res.first_token, max_tokens=32))
    while session.running():
        for done in session.step(): print(done.request_id, done.text, done.finish_reason)

Modules: ``models`` (catalogue, GGUF conversion, loading), ``variants`` (pool configurations),
``protocol`` (plain data + Executor/DecodeSession protocols), ``registry`` (backends),
``torch_backend`` (prefill, admission, tokenizer), ``decode_session`` + ``kv_cache``
(continuous batching on a preallocated KV), ``kv_codec``, ``kv_store``, ``profiler``, ``bench``.
"""

from __future__ import annotations

import os
from importlib import import_module
from typing import Any

# OpenMP threads that spin while waiting are catastrophic on a shared 2-core machine: measured
# under load ~5, a 128-token prefill took 3.0-3.8 s with the default policy and 0.47 s with
# PASSIVE (a decode step at batch 32: 2.4 s vs 0.25 s). libgomp reads this once, when torch is
# first imported, so it is set here, before any engine module imports torch; an explicit
# OMP_WAIT_POLICY in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_EXPORTS = {
    "build_executor": "registry",
    "BACKENDS": "registry",
    "VARIANTS": "variants",
    "VariantConfig": "variants",
    "variant_config": "variants",
    "MODELS": "models",
    "DEFAULT_MODEL": "models",
    "PrefillItem": "protocol",
    "PrefillResult": "protocol",
    "DecodeRequest": "protocol",
    "FinishedSequence": "protocol",
    "KVCache": "protocol",
    "KVMeta": "protocol",
    "PhaseTimings": "protocol",
    "TokenLogprobs": "protocol",
    "open_store": "kv_store",
    "KVIntegrityError": "errors",
    "KVNotFoundError": "errors",
    "AdmissionError": "errors",
    "PromptTooLongError": "errors",
    "KVBudgetError": "errors",
    "EngineError": "errors",
    "BackendUnavailableError": "errors",
    "kv_codec": None,
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'phaseroute.engine' has no attribute {name!r}")
    module = _EXPORTS[name]
    if module is None:
        return import_module(f"phaseroute.engine.{name}")
    return getattr(import_module(f"phaseroute.engine.{module}"), name)


__all__ = sorted(_EXPORTS)
