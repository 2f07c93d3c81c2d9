"""Over-long prompts and over-budget KV are refused with the numbers, before any compute."""

from __future__ import annotations

from typing import Any

import pytest

from phaseroute.engine.errors import AdmissionError, KVBudgetError, PromptTooLongError
from phaseroute.engine.protocol import DecodeRequest, PrefillItem
from phaseroute.engine.registry import build_executor


class ForwardCalled(AssertionError):
    pass


@pytest.fixture()
def no_compute(tiny: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    def boom(*args: Any, **kwargs: Any) -> None:
        raise ForwardCalled("a forward pass ran before admission refused the request")

    monkeypatch.setattr(tiny, "decoder", boom)
    return tiny


def test_prompt_beyond_context_is_refused_naming_numbers(no_compute: Any) -> None:
    assert no_compute.max_context == 256
    items = [PrefillItem("ok", 4, token_ids=(1, 2, 3)), PrefillItem("long", 10, token_ids=tuple([5] * 250))]
    with pytest.raises(PromptTooLongError) as info:
        no_compute.prefill(items)
    message = str(info.value)
    assert "'long'" in message and "250" in message and "10" in message and "260" in message and "256" in message
    assert not info.value.retryable


def test_kv_budget_is_enforced_before_prefill(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = build_executor("tiny-llama", "fp32", threads=1, kv_budget_bytes=100 * 512)  # 100 tokens x 512 B
    assert ex.kv_bytes_per_token() == 2 * 2 * 2 * 16 * 4
    monkeypatch.setattr(ex, "decoder", lambda *a, **k: (_ for _ in ()).throw(ForwardCalled()))
    with pytest.raises(KVBudgetError, match=r"101 tokens x 512 KV bytes/token = 51712 bytes > KV budget 51200"):
        ex.prefill([PrefillItem("big", 1, token_ids=tuple([5] * 100))])
    with pytest.raises(KVBudgetError, match="split the batch"):
        ex.prefill([PrefillItem(f"r{i}", 1, token_ids=tuple([5] * 30)) for i in range(4)])


def test_decode_session_refuses_join_beyond_budget() -> None:
    ex = build_executor("tiny-llama", "fp32", threads=1, kv_budget_bytes=300 * 512)
    [res] = ex.prefill([PrefillItem("a", 100, token_ids=tuple([5] * 100))])
    session = ex.decode_session(max_batch=8)
    session.add(DecodeRequest("a", res.kv, res.first_token, 100))
    assert not session.can_add(200)
    with pytest.raises(KVBudgetError, match="cannot join"):
        session.add(DecodeRequest("b", res.kv, res.first_token, 100))
    assert session.running() == 1


def test_max_batch_limits_rows(tiny: Any) -> None:
    [res] = tiny.prefill([PrefillItem("a", 5, token_ids=(5, 6, 7))])
    session = tiny.decode_session(max_batch=2)
    for name in ("a", "b"):
        session.add(DecodeRequest(name, res.kv, res.first_token, 5))
    assert not session.can_add(8)
    with pytest.raises(KVBudgetError, match="2/2 rows"):
        session.add(DecodeRequest("c", res.kv, res.first_token, 5))


@pytest.mark.parametrize("prompt,max_tokens", [(0, 5), (5, 0)])
def test_empty_prompt_or_zero_max_tokens(tiny: Any, prompt: int, max_tokens: int) -> None:
    with pytest.raises(AdmissionError, match=f"prompt_tokens={prompt} and max_tokens={max_tokens}"):
        tiny.check_admission(prompt, max_tokens, "r")


def test_item_needs_exactly_one_prompt_form(tiny: Any) -> None:
    with pytest.raises(ValueError, match="exactly one"):
        tiny.prefill([PrefillItem("r", 3, token_ids=(1,), prompt="hi")])
    with pytest.raises(ValueError, match="no tokenizer"):
        tiny.prefill([PrefillItem("r", 3, prompt="hi")])
