"""Attention for ragged decode batches without copying the KV.

transformers' SDPA path expands grouped-query K/V with ``repeat_kv`` (a full copy of every
layer's cache, every step) whenever an attention mask is present, which is always the case in
a continuous batch whose sequences have different lengths. For a one-token query the heads
that share a KV head can instead be folded into the query-length axis: query
``[b, kv_heads * g, 1, d]`` -> ``[b, kv_heads, g, d]`` attends to the un-expanded K/V
``[b, kv_heads, s, d]`` under a ``[b, 1, 1, s]`` mask, same math, no copy. Every other call
(prefill, uniform decode with no mask) goes to transformers' own ``sdpa_attention_forward``
unchanged, so the generate()-identical path stays identical.

``install(model)`` registers this as attention implementation ``"phaseroute_sdpa"`` (with
transformers' sdpa mask builder) and switches the model to it.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "phaseroute_sdpa"


def grouped_decode_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    groups = getattr(module, "num_key_value_groups", 1)
    if attention_mask is None or query.shape[2] != 1 or groups == 1 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    batch, heads, _, dim = query.shape
    folded = query.reshape(batch, key.shape[1], groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def install(model: Any) -> None:
    """Register ``phaseroute_sdpa`` once and make ``model`` use it."""
    AttentionInterface.register(NAME, grouped_decode_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
