"""Prefill + continuous-batching decode on the tiny deterministic model (fast unit tests)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from phaseroute.engine.errors import KVFormatError
from phaseroute.engine.protocol import DecodeRequest, PrefillItem

PROMPTS = [[(7 * i + 3 * j) % 500 + 3 for j in range(n)] for i, n in enumerate([3, 9, 17, 30, 5, 12])]
MAX_TOKENS = [10, 4, 20, 7, 15, 1]


def generate(ex: Any, prompt: list[int], max_tokens: int) -> list[int]:
    with torch.inference_mode():
        out = ex.model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_single_sequence_is_bit_identical_to_generate(tiny: Any, drain: Any) -> None:
    for prompt, max_tokens in zip(PROMPTS, MAX_TOKENS):
        [res] = tiny.prefill([PrefillItem("a", max_tokens, token_ids=tuple(prompt))])
        session = tiny.decode_session(max_batch=1)
        session.add(DecodeRequest("a", res.kv, res.first_token, max_tokens))
        assert drain(session)["a"].token_ids == generate(tiny, prompt, max_tokens)


def test_continuous_batching_join_and_leave(tiny: Any, drain: Any) -> None:
    results = tiny.prefill([PrefillItem(f"r{i}", m, token_ids=tuple(p)) for i, (p, m) in enumerate(zip(PROMPTS, MAX_TOKENS))])
    session = tiny.decode_session(max_batch=4)
    done: dict[str, Any] = {}
    pending, step, sizes = list(range(len(PROMPTS))), 0, []
    while pending or session.running():
        if pending and step % 2 == 0:  # a request joins every other step, while others run
            i = pending.pop(0)
            session.add(DecodeRequest(f"r{i}", results[i].kv, results[i].first_token, MAX_TOKENS[i]))
        sizes.append(session.rows())
        done.update({seq.request_id: seq for seq in session.step()})
        step += 1
    assert max(sizes) >= 3 and session.stats.max_batch_seen >= 3  # they really ran together
    for i, (prompt, max_tokens) in enumerate(zip(PROMPTS, MAX_TOKENS)):
        seq = done[f"r{i}"]
        assert len(seq.token_ids) == max_tokens and seq.finish_reason == "length"
        assert seq.steps == max_tokens - 1 and seq.prompt_len == len(prompt)
        assert seq.token_ids == generate(tiny, prompt, max_tokens)  # each leaves with its own length


def test_batched_ragged_prefill_matches_single(tiny: Any) -> None:
    batch = tiny.prefill([PrefillItem(f"r{i}", 2, token_ids=tuple(p)) for i, p in enumerate(PROMPTS)])
    for prompt, res in zip(PROMPTS, batch):
        [alone] = tiny.prefill([PrefillItem("x", 2, token_ids=tuple(prompt))])
        assert res.first_token == alone.first_token and res.prompt_len == len(prompt)
        assert res.kv.keys[0].shape == (2, len(prompt), 16)
        for a, b in zip(res.kv.keys + res.kv.values, alone.kv.keys + alone.kv.values):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert res.timings.batch_size == len(PROMPTS) and res.timings.compute_s > 0


def test_decode_step_writes_in_place_without_reallocating(tiny: Any) -> None:
    [res] = tiny.prefill([PrefillItem("a", 50, token_ids=tuple(PROMPTS[3]))])
    session = tiny.decode_session(max_batch=8, ignore_eos=True)
    for i in range(3):
        session.add(DecodeRequest(f"a{i}", res.kv, res.first_token, 40))
    session.step()
    pointer = session.kv.keys.data_ptr()
    for _ in range(20):
        session.step()
    assert session.kv.keys.data_ptr() == pointer  # one pool for the session's life
    assert session.kv.lengths == [len(PROMPTS[3]) + 21] * 3
    assert session.kv.blocks.taken == 3 * -(-(len(PROMPTS[3]) + 21) // session.kv.block_size)


def test_eos_first_token_and_max_tokens_one_finish_at_join(tiny: Any, drain: Any) -> None:
    [res] = tiny.prefill([PrefillItem("a", 5, token_ids=(5, 6, 7))])
    session = tiny.decode_session()
    session.add(DecodeRequest("one", res.kv, res.first_token, 1))
    eos_kv = type(res.kv)(res.kv.keys, res.kv.values, __import__("dataclasses").replace(res.kv.meta, first_token=2))
    session.add(DecodeRequest("eos", eos_kv, 2, 5))
    assert session.rows() == 0 and session.running() == 2
    done = drain(session)
    assert done["one"].finish_reason == "length" and done["one"].token_ids == [res.first_token]
    assert done["eos"].finish_reason == "stop" and done["eos"].token_ids == [2]


def test_logprobs_are_returned_per_token(tiny: Any, drain: Any) -> None:
    [res] = tiny.prefill([PrefillItem("a", 6, token_ids=tuple(PROMPTS[1]), return_logprobs=3)])
    session = tiny.decode_session(return_logprobs=3)
    session.add(DecodeRequest("a", res.kv, res.first_token, 6, first_logprobs=res.first_logprobs))
    seq = drain(session)["a"]
    assert [lp.token_id for lp in seq.logprobs] == seq.token_ids
    assert all(lp.top_ids[0] == lp.token_id and len(lp.top_logprobs) == 3 and lp.logprob <= 0 for lp in seq.logprobs)
    scored = tiny.score(list(PROMPTS[1]), seq.token_ids)
    for a, b in zip(scored, seq.logprobs):
        assert abs(a.logprob - b.logprob) < 1e-4  # teacher-forced scoring agrees with decode


def test_kv_from_another_model_shape_is_refused(tiny: Any) -> None:
    [res] = tiny.prefill([PrefillItem("a", 5, token_ids=(5, 6, 7))])
    wrong = type(res.kv)(res.kv.keys, res.kv.values, __import__("dataclasses").replace(res.kv.meta, model="smollm2-135m"))
    with pytest.raises(KVFormatError, match="smollm2-135m"):
        tiny.decode_session().add(DecodeRequest("a", wrong, res.first_token, 5))
