"""Torch/transformers executor: model + variant, tokenizer, admission checks, prefill, scoring.

Prefill runs a batch of prompts in one forward pass (right-padded; no mask at all when every
prompt has the same length, which is exactly the kernel path ``generate()`` takes), takes the
last real position of each row through the LM head, and returns per request the prompt KV
(views of the batch cache, ``[kv_heads, tokens, head_dim]`` per layer), the greedy first token
and timings. Every item is admitted (context and KV budget) before any compute starts.
``start_prefill`` returns the same work as a ``prefill_job.PrefillJob`` that runs in chunks of
positions (colocated workers interleave decode steps between the chunks).

Decode lives in ``decode_session.TorchDecodeSession``; this class only creates it.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import torch

from phaseroute.engine import attention
from phaseroute.engine.errors import AdmissionError, BackendUnavailableError, KVBudgetError, PromptTooLongError
from phaseroute.engine.models import load_model
from phaseroute.engine.prefill_job import PrefillJob
from phaseroute.engine.protocol import (
    PositionTrace,
    PrefillItem,
    PrefillResult,
    TokenLogprobs,
    kv_bytes_per_token,
)
from phaseroute.engine.variants import VariantConfig, apply_variant

DEFAULT_KV_BUDGET_BYTES = 4 << 30


class TorchExecutor:
    """One model in one variant on one device; see the module docstring."""

    def __init__(self, model: str, variant: VariantConfig, kv_budget_bytes: int | None = None) -> None:
        torch.set_num_threads(variant.threads)
        if variant.device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendUnavailableError(f"variant {variant.name!r} asks for device {variant.device!r}, but CUDA is not available")
        loaded = load_model(model)
        self.model_name, self.variant, self.config = loaded.name, variant.name, variant
        self.tokenizer = loaded.tokenizer
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        self.load_s = loaded.load_s
        self.model = apply_variant(loaded.model, variant)
        attention.install(self.model)
        self.device = torch.device(variant.device)
        cfg = self.model.config
        self.num_layers, self.kv_heads = cfg.num_hidden_layers, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.kv_dtype = getattr(torch, variant.dtype)
        self.kv_budget_bytes = DEFAULT_KV_BUDGET_BYTES if kv_budget_bytes is None else kv_budget_bytes
        self.pad_token_id = cfg.pad_token_id if cfg.pad_token_id is not None else 0
        self.decoder = self.model.get_decoder()
        self.lm_head = self.model.get_output_embeddings()
        params = inspect.signature(self.decoder.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.24

    # ---- what the control plane asks for admission -------------------------------------
    @property
    def max_context(self) -> int:
        return int(self.model.config.max_position_embeddings)

    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.num_layers, self.kv_heads, self.head_dim, torch.finfo(self.kv_dtype).bits // 8)

    def count_tokens(self, text: str) -> int:
        return len(self._require_tokenizer().encode(text, add_special_tokens=False))

    def apply_chat_template(self, messages: list[dict[str, str]] | tuple[dict[str, str], ...]) -> list[int]:
        """Token ids of OpenAI-style messages through the model's chat template (+ generation prompt)."""
        ids = self._require_tokenizer().apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def encode_item(self, item: PrefillItem) -> list[int]:
        given = [x is not None for x in (item.token_ids, item.messages, item.prompt)]
        if sum(given) != 1:
            raise ValueError(f"request {item.request_id!r}: give exactly one of token_ids, messages, prompt")
        if item.token_ids is not None:
            return list(item.token_ids)
        if item.messages is not None:
            return self.apply_chat_template(item.messages)
        ids: list[int] = self._require_tokenizer().encode(item.prompt, add_special_tokens=False)
        return ids

    def decode_text(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        text: str = self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        return text

    def check_admission(self, prompt_tokens: int, max_tokens: int, request_id: str = "") -> None:
        """Refuse (before any work) what cannot fit: the context window or the KV budget."""
        who = f"request {request_id!r}: " if request_id else ""
        if prompt_tokens < 1 or max_tokens < 1:
            raise AdmissionError(f"{who}prompt_tokens={prompt_tokens} and max_tokens={max_tokens} must both be >= 1")
        total = prompt_tokens + max_tokens
        if total > self.max_context:
            raise PromptTooLongError(
                f"{who}{prompt_tokens} prompt tokens + {max_tokens} max_tokens = {total} tokens "
                f"> {self.max_context}, the context of model {self.model_name!r}"
            )
        need = total * self.kv_bytes_per_token()
        if need > self.kv_budget_bytes:
            raise KVBudgetError(
                f"{who}{total} tokens x {self.kv_bytes_per_token()} KV bytes/token = {need} bytes "
                f"> KV budget {self.kv_budget_bytes} bytes (variant {self.variant!r})"
            )

    # ---- prefill ---------------------------------------------------------------------
    def prefill(self, items: list[PrefillItem]) -> list[PrefillResult]:
        if not items:
            return []
        results = self.start_prefill(items).advance(None)
        assert results is not None  # advance(None) runs the last chunk
        return results

    def start_prefill(self, items: list[PrefillItem]) -> PrefillJob:
        """Tokenize and admit ``items`` (before any compute); a job that runs them in chunks."""
        if not items:
            raise ValueError("a prefill job needs at least one item")
        started = time.perf_counter()
        encoded = [self.encode_item(item) for item in items]
        for item, ids in zip(items, encoded):
            self.check_admission(len(ids), item.max_tokens, item.request_id)
        padded = len(items) * max(len(ids) for ids in encoded)
        if padded * self.kv_bytes_per_token() > self.kv_budget_bytes:
            raise KVBudgetError(
                f"prefill batch of {len(items)} x {padded // len(items)} padded tokens needs "
                f"{padded * self.kv_bytes_per_token()} KV bytes > budget {self.kv_budget_bytes}; split the batch"
            )
        return PrefillJob(self, items, encoded, time.perf_counter() - started)

    # ---- decode and scoring ---------------------------------------------------------
    def decode_session(self, max_batch: int = 64, return_logprobs: int = 0, ignore_eos: bool = False, block_size: int | None = None) -> Any:
        """A continuous-batching session; ``return_logprobs=k`` records top-k log-probs per token;
        ``block_size``: tokens per KV block (default ``kv_cache.DEFAULT_BLOCK_SIZE``)."""
        from phaseroute.engine.decode_session import TorchDecodeSession
        from phaseroute.engine.kv_cache import DEFAULT_BLOCK_SIZE

        return TorchDecodeSession(self, max_batch=max_batch, return_logprobs=return_logprobs, ignore_eos=ignore_eos,
                                  block_size=block_size or DEFAULT_BLOCK_SIZE)

    def score(self, prompt_ids: list[int], continuation_ids: list[int], top_k: int = 0) -> list[TokenLogprobs]:
        """Teacher-forced log-probs of ``continuation_ids`` after ``prompt_ids`` (quality drift checks)."""
        self.check_admission(len(prompt_ids), max(1, len(continuation_ids)))
        ids = torch.tensor([list(prompt_ids) + list(continuation_ids)], dtype=torch.long, device=self.device)
        with torch.inference_mode():
            hidden = self.decoder(input_ids=ids, use_cache=False).last_hidden_state
            start = len(prompt_ids) - 1
            logits = self.lm_head(hidden[:, start : start + len(continuation_ids)])[0].float()
        return [_top_logprobs(logits[i], tok, top_k) for i, tok in enumerate(continuation_ids)]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError(f"model {self.model_name!r} has no tokenizer: pass token_ids")
        return self.tokenizer


def position_trace(logits: torch.Tensor, probe_ids: tuple[int, ...]) -> PositionTrace:
    """The model's own top-1 at one position and the log-probs of ``probe_ids`` (drift canaries)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top = int(logprobs.argmax())
    probed = tuple(logprobs[list(probe_ids)].tolist()) if probe_ids else ()
    return PositionTrace(top, float(logprobs[top]), probed)


def _top_logprobs(logits: torch.Tensor, chosen: int, top_k: int) -> TokenLogprobs:
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    if top_k <= 0:
        return TokenLogprobs(chosen, float(logprobs[chosen]))
    values, indices = logprobs.topk(top_k)
    return TokenLogprobs(chosen, float(logprobs[chosen]), tuple(indices.tolist()), tuple(values.tolist()))
