"""Chunked prefill: the same batch run in chunks of positions gives the same first tokens and KV."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from phaseroute.engine.protocol import PrefillItem

PROMPTS = [[(13 * i + 7 * j) % 500 + 3 for j in range(n)] for i, n in enumerate([5, 40, 23, 64, 1])]


@pytest.mark.parametrize("chunk_tokens", [1, 37, 120])
def test_chunks_give_the_unchunked_first_tokens_and_kv(tiny: Any, chunk_tokens: int) -> None:
    items = [PrefillItem(f"r{i}", 4, token_ids=tuple(p)) for i, p in enumerate(PROMPTS)]
    whole = tiny.prefill(items)
    job = tiny.start_prefill(items)
    results, calls = None, 0
    while results is None:
        results = job.advance(chunk_tokens)
        calls += 1
    assert calls == job.chunks == -(-64 // max(1, chunk_tokens // len(items)))
    for a, b in zip(whole, results):
        assert (a.request_id, a.first_token, a.prompt_len) == (b.request_id, b.first_token, b.prompt_len)
        for x, y in zip(a.kv.keys + a.kv.values, b.kv.keys + b.kv.values):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="already ran its last chunk"):
        job.advance(8)


def test_uniform_chunks_continue_positions(tiny: Any) -> None:
    items = [PrefillItem(f"u{i}", 3, token_ids=tuple(PROMPTS[3])) for i in range(2)]
    [alone, _] = tiny.prefill(items)
    job = tiny.start_prefill(items)
    assert job.advance(2 * 30) is None and job.padded_tokens_left() == 2 * 34
    [first, second] = job.advance(None) or []
    assert first.first_token == second.first_token == alone.first_token
    torch.testing.assert_close(first.kv.keys[1], alone.kv.keys[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("chunk_tokens", [None, 37])
def test_a_mixed_length_batch_gives_each_prompt_what_it_gets_alone(tiny: Any, chunk_tokens: int | None) -> None:
    """Right padding without a padding mask: the causal mask alone keeps every row's pad positions
    out of its real tokens' attention, so each prompt's first token and KV are its own."""
    items = [PrefillItem(f"r{i}", 4, token_ids=tuple(p)) for i, p in enumerate(PROMPTS)]
    job = tiny.start_prefill(items)
    batched = None
    while batched is None:
        batched = job.advance(chunk_tokens)
    for item, got in zip(items, batched):
        [alone] = tiny.prefill([item])
        assert (got.first_token, got.prompt_len) == (alone.first_token, alone.prompt_len), item.request_id
        assert got.kv.keys[0].shape == alone.kv.keys[0].shape
        for x, y in zip(got.kv.keys + got.kv.values, alone.kv.keys + alone.kv.values):
            torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
