"""A decode worker refuses KV it must not use, inside the handler's guard (real SmolLM2, a real
directory store): a location outside its store is never opened, KV of another model or dtype
and a first token that disagrees with the KV are never joined. Each is a retryable
attempt_failed for the tracker, and the worker goes on to decode the next request.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from phaseroute.consumers.decode_stage import blob_checksum
from phaseroute.consumers.handler import WorkItem
from phaseroute.consumers.phase_handler import PhaseHandler, WorkerSpec
from phaseroute.engine import kv_codec
from phaseroute.engine.kv_store import open_store
from phaseroute.engine.protocol import KVCache, PrefillItem
from phaseroute.infra.topics import ATTEMPTS_FAILED, RESULTS
from phaseroute.streams.policy.lifecycle import attempt_id
from phaseroute.streams.policy.types import Phase
from tests.consumers.work import CHAT

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def smol() -> Any:
    from phaseroute.engine.registry import build_executor

    return build_executor("smollm2-135m", "fp32", threads=2)


@pytest.fixture(scope="module")
def prefilled(smol: Any) -> Any:
    return smol.prefill([PrefillItem("job/r0", 6, prompt=CHAT.format(q="What is 12 times 7?"))])[0]


def _decode_work(store: Any, kv: KVCache, first_token: int, index: int, location: str | None = None) -> dict[str, Any]:
    written = store.put(f"job/r{index}", kv_codec.encode_parts(kv))
    blob = store.get(written)
    request_id = f"job/r{index}"
    return {
        "attempt_id": attempt_id(request_id, Phase.DECODE, 0), "request_id": request_id, "job_id": "job", "tenant": "t",
        "custom_id": f"c{index}", "attempt": 0, "pool": "dec", "model": "smollm2-135m", "source_pool": "pre",
        "prefill_attempt_id": attempt_id(request_id, Phase.PREFILL, 0), "kv_location": location or written,
        "kv_bytes": len(blob), "kv_checksum": blob_checksum(bytes(blob[-4:])), "kv_layout_version": kv.meta.layout_version,
        "prompt_tokens": kv.meta.prompt_len, "first_token": first_token, "max_tokens": 6,
        "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 6, "seed": None}, "priority": 1,
        "deadline": 4_000_000_000_000, "quality_tier": "EXACT", "prefill_time_s": 0.1, "dispatched_at": 0,
        "canary": None, "canary_trace": None,
    }


def _item(record: dict[str, Any], offset: int) -> WorkItem:
    return WorkItem(("decode.dec", 0), offset, "decode_work", record, 0.0, 0.0)


def _other_layout(kv: KVCache, **changes: Any) -> KVCache:
    return KVCache(kv.keys, kv.values, dataclasses.replace(kv.meta, **changes))


@pytest.mark.parametrize(("bad", "error_class", "names"), [
    ("outside the store", "KVNotFoundError", "outside store"),
    ("another model", "KVFormatError", "other-model"),
    ("another dtype", "KVFormatError", "bfloat16"),
    ("a first token the KV disagrees with", "KVFormatError", "first_token"),
])
def test_kv_the_worker_must_not_use_is_a_retryable_failure_and_the_next_request_runs(
        smol: Any, prefilled: Any, tmp_path: Path, bad: str, error_class: str, names: str) -> None:
    store = open_store(str(tmp_path / "kv"))
    spec = WorkerSpec("dec", "dec-0", "fp32", prefill=False, decode=True)
    handler = PhaseHandler(smol, store=store, spec=spec)
    kv, first = prefilled.kv, prefilled.first_token
    (tmp_path / "secret").write_text("not KV\n")
    record = {
        "outside the store": lambda: _decode_work(store, kv, first, 1, location=f"file://{tmp_path / 'secret'}"),
        "another model": lambda: _decode_work(store, _other_layout(kv, model="other-model"), first, 1),
        "another dtype": lambda: _decode_work(store, KVCache([k.bfloat16() for k in kv.keys], [v.bfloat16() for v in kv.values],
                                                             dataclasses.replace(kv.meta, dtype="bfloat16")), first, 1),
        "a first token the KV disagrees with": lambda: _decode_work(store, kv, first + 1, 1),
    }[bad]()
    [refused] = handler.admit([_item(record, 0)])
    assert refused.dead_letter_reason is None
    [failed] = refused.outputs
    assert failed.topic == ATTEMPTS_FAILED and failed.record["retryable"] is True
    assert failed.record["error_class"] == error_class and names in failed.record["error"]
    assert handler.in_flight() == 0  # nothing of it joined the session

    assert handler.admit([_item(_decode_work(store, kv, first, 2), 1)]) == []
    results = []
    while handler.in_flight():
        results += [o for c in handler.step() for o in c.outputs if o.topic == RESULTS]
    assert [r.record["request_id"] for r in results] == ["job/r2"] and results[0].record["output_token_ids"]
