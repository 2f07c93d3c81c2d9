"""Paged KV: block accounting, the pool's layout, paged attention, and decode on mixed lengths.

The model test runs the real SmolLM2 on prompts of mixed lengths in one continuous batch and
checks each sequence's greedy tokens against ``generate()`` for that prompt alone, and the KV
allocated per live token at the peak against the formula (the bound of issue 14: <= 1.25x).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from phaseroute.engine.attention import paged_decode_attention
from phaseroute.engine.kv_blocks import BlockAllocator
from phaseroute.engine.kv_cache import PagedKV
from phaseroute.engine.protocol import DecodeRequest, PrefillItem

MEMORY_BOUND = 1.25  # KV bytes allocated per live token at the peak, in units of the formula


def test_blocks_are_taken_lowest_first_reserved_and_given_back() -> None:
    blocks = BlockAllocator(num_blocks=10, block_size=4)
    assert blocks.admit("a", prompt_tokens=5, total_tokens=12) == [0, 1]  # 2 taken, 1 reserved
    assert (blocks.taken, blocks.reserved, blocks.free_blocks) == (2, 1, 7)
    assert blocks.admit("b", 4, 4) == [2]
    assert blocks.grow("a") == 3 and blocks.tables["a"].blocks == [0, 1, 3]
    with pytest.raises(MemoryError, match="used all 3 KV blocks"):
        blocks.grow("a")
    assert blocks.release("a") == [0, 1, 3] and blocks.high_water == 3
    assert blocks.admit("c", 1, 4) == [0]  # the lowest free block again
    assert not blocks.can_admit(4 * 9) and blocks.can_admit(4 * 8)
    with pytest.raises(MemoryError, match="needs 9 KV blocks"):
        blocks.admit("d", 1, 36)
    with pytest.raises(ValueError, match="'c' already holds"):
        blocks.admit("c", 1, 1)


def test_pool_holds_prompts_in_their_blocks_and_rewrites_owners_when_a_row_moves() -> None:
    kv = PagedKV(num_layers=2, kv_heads=1, head_dim=3, dtype=torch.float32, device="cpu", num_blocks=16, block_size=4)
    for i, n in enumerate((6, 4, 9)):
        layer = [torch.arange(n, dtype=torch.float32).repeat(3, 1).T[None] + 100 * i] * 2
        assert kv.join(f"s{i}", layer, layer, n, n + 3) == i
    table = kv.blocks.tables["s2"].blocks
    stored = kv.keys[1, table].transpose(0, 1).reshape(1, -1, 3)[:, :9]  # block table order = token order
    assert torch.equal(stored[0, :, 0], torch.arange(9, dtype=torch.float32) + 200)
    assert kv.fill[table].tolist() == [4, 4, 1] and kv.blocks.taken == 2 + 1 + 3
    assert kv.allocated_bytes() == 6 * kv.block_bytes() == 6 * 2 * 2 * 1 * 4 * 3 * 4
    assert kv.leave(0) == 2  # s2 takes row 0
    assert kv.row_ids == ["s2", "s1"] and kv.lengths == [9, 4]
    assert kv.owner[table].tolist() == [0, 0, 0] and kv.fill[[0, 1]].tolist() == [0, 0]


def test_a_step_compacts_the_holes_a_leaver_left_so_attention_reads_only_used_blocks() -> None:
    kv = PagedKV(num_layers=2, kv_heads=1, head_dim=3, dtype=torch.float32, device="cpu", num_blocks=16, block_size=4)
    for i, n in enumerate((9, 6, 5)):  # blocks [0, 1, 2], [3, 4], [5, 6]
        layer = [torch.arange(n, dtype=torch.float32).repeat(3, 1).T[None] + 100 * i] * 2
        kv.join(f"s{i}", layer, layer, n, n)
    kv.leave(0)  # a hole of 3 blocks at the bottom; s2 takes row 0
    assert kv.blocks.high_water == 7 and kv.blocks.taken == 4
    step = kv.step_cache()
    assert step.high_water == kv.blocks.taken == 4 and kv.blocks.high_water == 4
    assert sorted(kv.blocks.tables["s1"].blocks + kv.blocks.tables["s2"].blocks) == [0, 1, 2, 3]
    for row, (seq, n, base) in enumerate((("s2", 5, 200), ("s1", 6, 100))):
        table = kv.blocks.tables[seq].blocks
        stored = kv.keys[1, table].transpose(0, 1).reshape(1, -1, 3)[0, :n, 0]  # token order kept
        assert torch.equal(stored, torch.arange(n, dtype=torch.float32) + base)
        assert kv.owner[table].tolist() == [row] * len(table)
    assert kv.fill[:4].sum().item() == 5 + 6 + 2 and kv.fill[4:].sum().item() == 0  # + each row's slot for this step
    assert not kv.keys[:, 4:7].any() and not kv.values[:, 4:7].any()  # moved-from blocks are free and zero
    assert kv.blocks.admit("s3", 4, 4) == [4]  # the lowest free block, right above the used prefix


def _reference_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """Per row: plain softmax attention of its query heads over its own contiguous K/V."""
    out = []
    for row, (k, v) in enumerate(zip(keys, values)):
        groups = q.shape[1] // k.shape[0]
        k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)  # [heads, n, d]
        weights = torch.softmax(q[row] @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        out.append((weights @ v).transpose(0, 1))  # [1, heads, d]
    return torch.stack(out)


def test_paged_attention_matches_plain_attention_on_mixed_lengths() -> None:
    torch.manual_seed(0)
    kv_heads, heads, dim, bs = 2, 6, 8, 4
    kv = PagedKV(num_layers=1, kv_heads=kv_heads, head_dim=dim, dtype=torch.float32, device="cpu", num_blocks=32, block_size=bs)
    lengths = [1, 7, 12, 3]
    keys = [torch.randn(kv_heads, n, dim) for n in lengths]
    values = [torch.randn(kv_heads, n, dim) for n in lengths]
    for i, n in enumerate(lengths):
        kv.join(f"s{i}", [keys[i]], [values[i]], n, n + 4)
    kv.leave(1)  # a hole in the pool; s3 moves to row 1
    keys, values, lengths = [keys[0], keys[3], keys[2]], [values[0], values[3], values[2]], [1, 3, 12]
    step = kv.step_cache()
    new_k, new_v = torch.randn(3, kv_heads, 1, dim), torch.randn(3, kv_heads, 1, dim)
    pool_k, pool_v = step.update(new_k, new_v, 0)
    q = torch.randn(3, heads, 1, dim)
    got = paged_decode_attention(q, pool_k, pool_v, step.valid, step.owner, None)
    want = _reference_attention(
        q, [torch.cat([k, new_k[i]], 1) for i, k in enumerate(keys)], [torch.cat([v, new_v[i]], 1) for i, v in enumerate(values)]
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _generate(ex: Any, prompt: list[int], max_tokens: int) -> list[int]:
    with torch.inference_mode():
        out = ex.model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=ex.pad_token_id)
    return out[0, len(prompt):].tolist()


def _continuous(ex: Any, prompts: list[list[int]], max_tokens: list[int], join_per_step: int) -> tuple[dict[str, list[int]], float]:
    """Decode every prompt in one continuous batch; tokens per request and the peak KV bytes per live token."""
    results = [ex.prefill([PrefillItem(f"r{i}", m, token_ids=tuple(p))])[0] for i, (p, m) in enumerate(zip(prompts, max_tokens))]
    session = ex.decode_session(max_batch=len(prompts))
    pending, done, peak = list(range(len(prompts))), {}, (0, 1)
    while pending or session.running():
        for i in pending[:join_per_step]:
            session.add(DecodeRequest(f"r{i}", results[i].kv, results[i].first_token, max_tokens[i]))
        pending = pending[join_per_step:]
        if session.kv_bytes_allocated() >= peak[0]:
            peak = (session.kv_bytes_allocated(), max(1, session.kv.live_tokens()))
        done.update({seq.request_id: seq.token_ids for seq in session.step()})
    return done, peak[0] / peak[1] / ex.kv_bytes_per_token()


def test_tiny_mixed_lengths_identical_to_generate_within_the_memory_bound(tiny: Any) -> None:
    lengths, max_tokens = [64, 100, 130, 77, 200, 90, 160, 70], [20, 9, 31, 16, 24, 12, 40, 5]
    prompts = [[(11 * i + 5 * j) % 500 + 3 for j in range(n)] for i, n in enumerate(lengths)]
    done, per_token = _continuous(tiny, prompts, max_tokens, join_per_step=3)
    for i, (prompt, m) in enumerate(zip(prompts, max_tokens)):
        assert done[f"r{i}"] == _generate(tiny, prompt, m)
    assert per_token <= MEMORY_BOUND, f"KV per live token at peak is {per_token:.2f}x the formula"


@pytest.mark.model
def test_smollm2_mixed_lengths_bit_identical_to_generate_within_the_memory_bound(smol: Any) -> None:
    from phaseroute.engine.prompts import mixed_workload

    work = mixed_workload(smol.tokenizer, 10, [48, 96, 192, 384, 512], [16, 24, 32, 48])
    prompts, max_tokens = [ids for ids, _ in work], [m for _, m in work]
    done, per_token = _continuous(smol, prompts, max_tokens, join_per_step=4)
    for i, (prompt, m) in enumerate(zip(prompts, max_tokens)):
        assert done[f"r{i}"] == _generate(smol, prompt, m), f"request {i} ({len(prompt)} prompt tokens)"
    assert per_token <= MEMORY_BOUND, f"KV per live token at peak is {per_token:.2f}x the formula"


def test_non_finite_leftovers_of_a_sequence_that_left_never_reach_another_row() -> None:
    torch.manual_seed(1)
    kv_heads, heads, dim, bs = 1, 2, 4, 4
    kv = PagedKV(num_layers=1, kv_heads=kv_heads, head_dim=dim, dtype=torch.float32, device="cpu", num_blocks=8, block_size=bs)
    kv.keys.fill_(float("nan"))  # what torch.empty may hold
    kv.values.fill_(float("nan"))
    poisoned = torch.full((kv_heads, 7, dim), float("inf"))  # a corrupted KV (e.g. bit flips in exponents)
    kv.join("bad", [poisoned], [poisoned], 7, 8)  # blocks 0, 1
    good_k, good_v = torch.randn(kv_heads, 5, dim), torch.randn(kv_heads, 5, dim)
    kv.join("good", [good_k], [good_v], 5, 8)  # blocks 2, 3: a partly filled last block
    kv.leave(0)  # "bad" leaves: blocks 0, 1 are free; "good" is row 0 now
    kv.join("other", [good_k[:, :3]], [good_v[:, :3]], 3, 4)  # takes block 0 again; block 1 stays a free hole
    kv.join("third", [good_k], [good_v], 5, 6)
    kv.leave(1)  # "other" leaves again: holes 0 and 1 below the high water mark; two rows keep the paged path
    new_k, new_v = torch.randn(1, kv_heads, 1, dim), torch.randn(1, kv_heads, 1, dim)
    step = kv.step_cache()
    pool_k, pool_v = step.update(torch.cat([new_k, new_k]), torch.cat([new_v, new_v]), 0)
    q = torch.randn(2, heads, 1, dim)
    got = paged_decode_attention(q, pool_k, pool_v, step.valid, step.owner, None)
    assert torch.isfinite(got).all()
    want = _reference_attention(q, [torch.cat([good_k, new_k[0]], 1)] * 2, [torch.cat([good_v, new_v[0]], 1)] * 2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
