"""The one place backends are registered; each is imported only when it is built.

``BACKENDS`` maps a backend name to ``"module:Class"``. ``build_executor`` picks the backend,
resolves the variant (plain data, ``variants.VariantConfig``) and constructs the executor. A CPU
node never imports vLLM: its module is only imported when ``backend="vllm"`` is asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

from phaseroute.engine.errors import UnknownNameError
from phaseroute.engine.models import DEFAULT_MODEL, model_spec
from phaseroute.engine.variants import VariantConfig, variant_config

BACKENDS: dict[str, str] = {
    "torch": "phaseroute.engine.torch_backend:TorchExecutor",
    "vllm": "phaseroute.engine.vllm_backend:VllmExecutor",
}


def backend_class(name: str) -> type:
    """Import and return the executor class registered as ``name``."""
    if name not in BACKENDS:
        raise UnknownNameError(f"unknown backend {name!r}; known backends: {sorted(BACKENDS)}")
    module_name, _, attr = BACKENDS[name].partition(":")
    executor_class: type = getattr(importlib.import_module(module_name), attr)
    return executor_class


def build_executor(
    model: str = DEFAULT_MODEL,
    variant: str | VariantConfig = "fp32",
    threads: int | None = None,
    device: str | None = None,
    backend: str = "torch",
    kv_budget_bytes: int | None = None,
) -> Any:
    """An executor for ``model`` in ``variant`` (a name from ``variants.VARIANTS`` or a config).

    ``threads``/``device`` override the variant's; ``kv_budget_bytes`` bounds the KV one
    executor may hold (admission refuses beyond it).
    """
    model_spec(model)  # fail fast on an unknown model name
    config = variant if isinstance(variant, VariantConfig) else variant_config(variant, threads, device)
    if isinstance(variant, VariantConfig) and (threads is not None or device is not None):
        from dataclasses import replace

        config = replace(config, threads=threads or config.threads, device=device or config.device)
    return backend_class(backend)(model, config, kv_budget_bytes=kv_budget_bytes)
