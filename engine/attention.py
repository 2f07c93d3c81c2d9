"""Attention for ragged decode batches without copying the KV.

transformers' SDPA path expands grouped-query K/V with ``repeat_kv`` (a full copy of every
layer's cache, every step) whenever an attention mask is present, which is always the case in
a continuous batch whose sequences have different lengths. For a one-token query the heads
that share a KV head can instead be folded into the query-length axis: query
``[b, kv_heads * g, 1, d]`` -> ``[b, kv_heads, g, d]`` attends to the un-expanded K/V
``[b, kv_heads, s, d]`` under a ``[b, 1, 1, s]`` mask, same math, no copy. Every other call
(prefill, uniform decode with no mask) goes to transformers' own ``sdpa_attention_forward``
unchanged, so the generate()-identical path stays identical.

Paged decode (``paged_owner`` passed through the model's kwargs): the keys/values are the used
blocks of a ``kv_cache.PagedKV`` pool, ``[blocks, kv_heads, block_size, head_dim]``, each owned by
one row of the batch, and the mask says which tokens of each block are valid. Every block is
scored against its owner's query in one batched matmul, and the softmax is taken per row
across that row's blocks (max and sum gathered with ``scatter_reduce_``/``index_add_``): the
block table is read in place, no per-sequence copy of the cache.

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
    owner = kwargs.get("paged_owner")
    if owner is not None:
        return paged_decode_attention(query, key, value, attention_mask, owner, scaling), None  # type: ignore[arg-type]
    if attention_mask is None or query.shape[2] != 1 or groups == 1 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    batch, heads, _, dim = query.shape
    folded = query.reshape(batch, key.shape[1], groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def paged_decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, valid: torch.Tensor, owner: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """Attention of one query token per row over paged KV; returns ``[rows, 1, heads, head_dim]``.

    ``query`` ``[rows, heads, 1, d]``; ``key``/``value`` ``[blocks, kv_heads, block_size, d]``;
    ``valid`` ``[blocks, 1, 1, block_size]`` (bool); ``owner`` ``[blocks]``, the row of each block
    (free blocks are all invalid). Every row owns at least one valid token.
    """
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = dim**-0.5 if scaling is None else scaling
    q = query.reshape(rows, kv_heads, heads // kv_heads, dim)  # the heads sharing a KV head, side by side
    scores = torch.matmul(q.index_select(0, owner), key.transpose(-1, -2)).float().mul_(scale)  # [blocks, kvh, g, bs]
    scores.masked_fill_(~valid, float("-inf"))
    row_max = torch.full((rows, *scores.shape[1:3]), float("-inf"), dtype=scores.dtype, device=scores.device)
    block_max = scores.amax(dim=-1)
    row_max.scatter_reduce_(0, owner[:, None, None].expand_as(block_max), block_max, "amax")
    weights = scores.sub_(row_max.index_select(0, owner).unsqueeze(-1)).exp_()
    total = torch.zeros_like(row_max).index_add_(0, owner, weights.sum(dim=-1))
    out = torch.zeros((rows, kv_heads, heads // kv_heads, dim), dtype=torch.float32, device=value.device)
    out.index_add_(0, owner, torch.matmul(weights.to(value.dtype), value).float()).div_(total.unsqueeze(-1))
    return out.to(query.dtype).reshape(rows, heads, 1, dim).transpose(1, 2).contiguous()


def install(model: Any) -> None:
    """Register ``phaseroute_sdpa`` once and make ``model`` use it."""
    AttentionInterface.register(NAME, grouped_decode_sdpa)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
