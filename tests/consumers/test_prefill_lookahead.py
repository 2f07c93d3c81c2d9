"""A prefill stage holds a few micro-batches' worth of prompts (``MicroBatchLimits.held``), so
each batch is picked among them: prompts of one length end up together even when they arrive
interleaved with others, and a prefill-only worker offers that many to the control plane.
Real SmolLM2 (the stage tokenizes and prefills), no Kafka: the handler never touches it."""

from __future__ import annotations

from typing import Any

import pytest

from phaseroute.consumers.handler import WorkItem
from phaseroute.consumers.phase_handler import PhaseHandler, WorkerSpec
from phaseroute.consumers.prefill_stage import MicroBatchLimits, PrefillStage
from phaseroute.consumers.telemetry_records import BatchCounter, WorkerTag
from tests.consumers.work import CHAT, prefill_work

pytestmark = pytest.mark.model
# three prompt lengths (32, 69 and 154 tokens), far enough apart that no two share a batch within the
# padding bound (pick_batch: 25%)
QUESTIONS = (
    "Why?",
    "Why is the sky blue on a clear day in summer, and why does it turn red and orange at sunset over the sea, "
    "the fields, the woods and the old hills behind the town?",
    "Explain, with an example from cooking and one from travel, why planning ahead saves time and money and which "
    "habits make it easier for a busy person to plan a week of meals, trips, errands and savings, and how a family "
    "of four with two jobs and a small kitchen might start doing that next Monday morning, what they should buy "
    "first, which apps or notebooks help, how to share the work fairly between the adults and the children, and "
    "what to do in a week when everything goes wrong and nothing that was planned actually happens at all, "
    "twice in a row, in the coldest month of the year.",
)


@pytest.fixture(scope="module")
def smol() -> Any:
    from phaseroute.engine.registry import build_executor

    return build_executor("smollm2-135m", "fp32", threads=2)


def _interleaved(n: int) -> list[WorkItem]:
    records = [prefill_work("job", i, CHAT.format(q=QUESTIONS[i % 3]), "pre", 4, decode_pool="dec", colocated=False)
               for i in range(n)]
    return [WorkItem(("prefill.pre", 0), i, "prefill_work", r, r["dispatched_at"] / 1000, 0.0) for i, r in enumerate(records)]


def _batches(smol: Any, lookahead: int) -> tuple[list[list[int]], list[int]]:
    """The request numbers of each batch, and the stage's room after each accept."""
    stage = PrefillStage(smol, WorkerTag("pre", "pre-0", "smollm2-135m", "fp32"), BatchCounter("pre-0"),
                         MicroBatchLimits(max_batch=4, max_wait_s=0.0, lookahead=lookahead))
    items, rooms, batches = _interleaved(12), [], []
    while items or stage.in_flight():
        while items and stage.room() > 0:
            assert stage.accept(items.pop(0)) is None
            rooms.append(stage.room())
        ran = stage.run()
        assert ran is not None  # unchunked: one call runs the whole batch
        batches.append([int(item.record["custom_id"].removeprefix("req-")) for item, _ in ran[0]])
    return batches, rooms


def test_a_stage_holding_several_batches_groups_one_length_per_batch(smol: Any) -> None:
    batches, rooms = _batches(smol, lookahead=3)
    assert rooms[:12] == list(range(11, -1, -1))  # held = 4 x 3: all twelve are taken in before the first batch
    assert sorted(sum(batches, [])) == list(range(12))  # every request once
    assert [sorted({i % 3 for i in b}) for b in batches] == [[0], [1], [2]]  # each batch one length, four prompts
    assert all(len(b) == 4 for b in batches)


def test_a_stage_holding_one_batch_runs_smaller_mixed_batches(smol: Any) -> None:
    batches, _ = _batches(smol, lookahead=1)  # the rule before the look-ahead: at most max_batch held
    assert sorted(sum(batches, [])) == list(range(12))
    assert len(batches) > 3 and max(len(b) for b in batches) < 4


def test_a_prefill_worker_offers_what_it_holds_and_a_decoding_one_its_batch(smol: Any) -> None:
    limits = MicroBatchLimits(max_batch=4, lookahead=3)
    prefill = PhaseHandler(smol, store=None, spec=WorkerSpec("pre", "pre-0", "fp32", prefill=True, decode=False, limits=limits))
    colocated = PhaseHandler(smol, store=None, spec=WorkerSpec("colo", "colo-0", "fp32", prefill=True, decode=True,
                                                               limits=limits, max_decode_batch=16))
    assert prefill.status()["max_batch"] == 12
    assert colocated.status()["max_batch"] == 16


@pytest.mark.parametrize("bad", [0, -1])
def test_a_lookahead_below_one_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="lookahead"):
        MicroBatchLimits(lookahead=bad)
