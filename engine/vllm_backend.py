"""vLLM backend placeholder: registered so a GPU pool can ask for it, imported only then.

vllm pins its own CUDA torch and an older transformers, so it cannot share this environment
(see the notes); until a GPU image carries it, building this backend fails with a clear error.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from phaseroute.engine.errors import BackendUnavailableError
from phaseroute.engine.variants import VariantConfig


class VllmExecutor:
    """Would wrap ``vllm.LLM``; today it only explains why it cannot run here."""

    def __init__(self, model: str, variant: VariantConfig, kv_budget_bytes: int | None = None) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise BackendUnavailableError(
                f"backend 'vllm' (model {model!r}, variant {variant.name!r}) needs the vllm package, "
                "which is not installed here; install phaseroute[vllm] on a CUDA machine or use backend 'torch'"
            )
        raise BackendUnavailableError(
            "backend 'vllm' is installed but its executor is not implemented yet: "
            "use backend 'torch' (device='cuda' runs the same protocol on a GPU)"
        )

    def __getattr__(self, name: str) -> Any:  # pragma: no cover - never constructed
        raise BackendUnavailableError("backend 'vllm' is not available")
