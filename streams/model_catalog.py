"""What the control plane knows about a model without loading its weights: its context
length and tokenizer (prompt rendering and token counting for admission)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelInfo:
    name: str
    context_tokens: int
    tokenizer: Any
    # a fast tokenizer must not be called from two threads at once (it sets its truncation state
    # per call): intakes of several jobs take it chunk by chunk
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def render(self, prompt: str | None, messages: list[dict[str, str]] | None) -> str:
        """The full model input: raw ``prompt`` text, or ``messages`` through the chat template."""
        if messages:
            return str(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        if prompt is None:
            raise ValueError("a request needs a prompt or messages")
        return prompt

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))


@lru_cache(maxsize=8)
def load_model_info(name: str, cache_root: Path) -> ModelInfo:
    """Context length and tokenizer of ``name`` from the engine's converted model directory."""
    from transformers import AutoConfig, AutoTokenizer

    from phaseroute.engine.models import ensure_converted, model_spec

    spec = model_spec(name)
    if spec.tiny:
        raise ValueError(f"model {name!r} is a test model without a tokenizer; it cannot serve jobs")
    path = ensure_converted(spec, cache_root)
    config = AutoConfig.from_pretrained(path)
    return ModelInfo(name, int(config.max_position_embeddings), AutoTokenizer.from_pretrained(path))
