"""Per-request teacher forcing and traces in the engine (the canaries' FORCED runs), and the
KV bit-flip fault injector, on the tiny model."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from phaseroute.consumers.phase_handler import KVBitflips
from phaseroute.engine import kv_codec
from phaseroute.engine.canaries.build import run_batch
from phaseroute.engine.protocol import PrefillItem, TokenProbe

PROMPT = tuple((11 * j) % 400 + 3 for j in range(13))
OTHER = tuple((5 * j) % 300 + 7 for j in range(9))


def test_forcing_the_greedy_tokens_reproduces_them_with_a_trace(tiny: Any) -> None:
    [free] = run_batch(tiny, [PROMPT], [8], [None])
    tops = tuple(s.top_ids for s in tiny.score(list(PROMPT), free.token_ids, top_k=4))
    [forced] = run_batch(tiny, [PROMPT], [len(free.token_ids)], [TokenProbe(tuple(free.token_ids), tops)])
    assert forced.token_ids == free.token_ids and free.trace is None
    assert [t.argmax_id for t in forced.trace] == free.token_ids  # one trace per position, position 0 included
    scored = tiny.score(list(PROMPT), free.token_ids, top_k=4)
    for trace, s in zip(forced.trace, scored):
        assert trace.probe_logprobs == pytest.approx(s.top_logprobs, abs=1e-4)  # decode path agrees with scoring


def test_forced_tokens_replace_the_greedy_choice_and_the_trace_shows_the_models_own(tiny: Any) -> None:
    [free] = run_batch(tiny, [PROMPT], [6], [None])
    forced_tokens = tuple(t + 1 for t in free.token_ids)  # a different continuation
    [run] = run_batch(tiny, [PROMPT], [6], [TokenProbe(forced_tokens)])
    assert tuple(run.token_ids) == forced_tokens
    own = [s.top_ids[0] for s in tiny.score(list(PROMPT), list(forced_tokens), top_k=1)]
    assert [t.argmax_id for t in run.trace] == own and all(t.probe_logprobs == () for t in run.trace)


def test_a_probed_row_does_not_change_its_batch_neighbours(tiny: Any) -> None:
    [alone] = run_batch(tiny, [OTHER], [8], [None])
    probe = TokenProbe(tuple(range(3, 11)), ((1, 2),) * 8)
    other, probed = run_batch(tiny, [OTHER, PROMPT], [8, 8], [None, probe])
    assert other.token_ids == alone.token_ids and other.trace is None
    assert probed.token_ids == list(range(3, 11)) and len(probed.trace) == 8
    assert all(len(t.probe_logprobs) == 2 for t in probed.trace)


def test_kv_bitflips_pass_every_integrity_check_and_flip_about_rate_bits(tiny: Any) -> None:
    [res] = tiny.prefill([PrefillItem("a", 4, token_ids=PROMPT)])
    clean = [t.clone() for t in (*res.kv.keys, *res.kv.values)]
    fault = KVBitflips(rate=1e-3, to_pool="dec-b", seed=7)
    assert fault.applies("dec-b") and not fault.applies("dec-c") and not KVBitflips(0.0).applies("dec-b")
    bad, flipped = fault.corrupt(res.kv, "req/prefill/0")
    assert all(torch.equal(a, b) for a, b in zip(clean, (*res.kv.keys, *res.kv.values)))  # the original is untouched
    bits = sum(t.numel() * t.element_size() * 8 for t in clean)
    assert abs(flipped - bits * 1e-3) < 6 * (bits * 1e-3) ** 0.5
    popcount = sum(bin(x).count("1") for a, b in zip(clean, (*bad.keys, *bad.values))
                   for x in torch.bitwise_xor(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)).tolist())
    assert popcount == flipped
    decoded = kv_codec.decode(kv_codec.encode(bad))  # the codec frames the damaged values: every check passes
    assert decoded.meta == res.kv.meta and torch.equal(decoded.keys[0], bad.keys[0].to(decoded.keys[0].dtype))
    assert fault.corrupt(res.kv, "req/prefill/0")[1] == flipped  # deterministic per attempt
    with pytest.raises(ValueError, match="must be in"):
        KVBitflips(1.5)
