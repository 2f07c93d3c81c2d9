"""A colocated worker's handler runs a new prefill in chunks between decode steps (real SmolLM2).

The handler never touches Kafka (the loop does), so this drives ``PhaseHandler`` directly with
work records shaped as on ``prefill.<pool>``: decode keeps stepping while a long prompt's
prefill is under way, and every request's tokens equal those of a handler that prefills in one
pass.
"""

from __future__ import annotations

from typing import Any

import pytest

from phaseroute.consumers.handler import WorkItem
from phaseroute.consumers.phase_handler import PhaseHandler, WorkerSpec
from phaseroute.consumers.prefill_stage import MicroBatchLimits
from tests.consumers.work import CHAT, prefill_work

pytestmark = pytest.mark.model
LONG = CHAT.format(q="Summarise this: " + " ".join(["the train left the station on time and"] * 40))


@pytest.fixture(scope="module")
def smol() -> Any:
    from phaseroute.engine.registry import build_executor

    return build_executor("smollm2-135m", "fp32", threads=2)


def _item(record: dict[str, Any], offset: int) -> WorkItem:
    return WorkItem(("prefill.colo", 0), offset, "prefill_work", record, record["dispatched_at"] / 1000, 0.0)


def _run(smol: Any, chunk_tokens: int) -> tuple[dict[str, list[int]], list[tuple[bool, int]]]:
    spec = WorkerSpec("colo", "colo-0", "fp32", prefill=True, decode=True, limits=MicroBatchLimits(max_batch=4, max_wait_s=0.0),
                      max_decode_batch=8, prefill_chunk_tokens=chunk_tokens)
    handler = PhaseHandler(smol, store=None, spec=spec)
    short = [prefill_work("job", i, CHAT.format(q=q), "colo", 30, decode_pool=None, colocated=True)
             for i, q in enumerate(["What is 12 times 7?", "Why is the sky blue?"])]
    done: dict[str, list[int]] = {}
    trace: list[tuple[bool, int]] = []  # per step: prefill job in progress, decode steps so far
    assert handler.admit([_item(r, i) for i, r in enumerate(short)]) == []
    while handler.decode.session.rows() < 2:  # type: ignore[union-attr]
        handler.step()
    assert handler.admit([_item(prefill_work("job", 9, LONG, "colo", 8, decode_pool=None, colocated=True), 9)]) == []
    while handler.in_flight():
        for completion in handler.step():
            out = completion.outputs[0].record
            done[out["request_id"]] = out["output_token_ids"]
        trace.append((handler.prefill.job is not None, handler.decode.session.stats.steps))  # type: ignore[union-attr]
    return done, trace


def test_decode_steps_run_between_the_chunks_of_a_long_prefill(smol: Any) -> None:
    chunked, trace = _run(smol, chunk_tokens=64)
    during = [steps for in_progress, steps in trace if in_progress]
    assert len(during) >= 4, trace  # the long prompt (~400 tokens) took several chunks ...
    assert during[-1] - during[0] >= len(during) - 1  # ... and the decode batch stepped after each one
    whole, whole_trace = _run(smol, chunk_tokens=1_000_000)
    assert not any(in_progress for in_progress, _ in whole_trace)  # one pass: never in progress after a step
    assert chunked == whole and len(chunked) == 3


def test_a_copy_of_a_request_running_here_is_done_without_output(smol: Any) -> None:
    spec = WorkerSpec("colo", "colo-0", "fp32", prefill=True, decode=True, limits=MicroBatchLimits(max_batch=4, max_wait_s=0.0))
    handler = PhaseHandler(smol, store=None, spec=spec)
    original = prefill_work("job", 0, CHAT.format(q="What is 12 times 7?"), "colo", 6, decode_pool=None, colocated=True)
    copy = prefill_work("job", 0, original["prompt"], "colo", 6, decode_pool=None, colocated=True, attempt=1)
    [skipped] = handler.admit([_item(original, 0), _item(copy, 1)])
    assert skipped.item.offset == 1 and skipped.outputs == [] and skipped.dead_letter_reason is None
    handler.step()  # prefilled: the request now decodes, a late copy is still a copy
    [late] = handler.admit([_item(dict(copy, attempt_id=copy["attempt_id"] + "-late"), 2)])
    assert late.outputs == [] and handler.duplicates_skipped == 2
    results = []
    while handler.in_flight():
        results += [c for c in handler.step() if c.outputs]
    assert [c.item.offset for c in results] == [0] and results[0].outputs[0].record["attempt_id"] == original["attempt_id"]
