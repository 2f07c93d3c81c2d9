"""Two workers of a colocated pool (one group, subscribed to its prefill and decode topics) each
get partitions of both topics, on the real broker. With the default cooperative-sticky assignor
one of them got every prefill partition and the other every decode partition, so the second never
prefilled (see ``loop.consumer_overrides``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from phaseroute.consumers.loop import LoopConfig, WorkerLoop, consumer_overrides


class Idle:
    """A handler double that never has work: the test only watches the assignment."""

    def in_flight(self) -> int:
        return 0

    def batch_ready(self, now: float) -> bool:
        return False

    def due_in(self, now: float) -> float | None:
        return None

    def drop(self, partitions: list[tuple[str, int]]) -> None:
        pass


def test_a_worker_on_several_topics_splits_each_topic_and_one_topic_keeps_the_default() -> None:
    two = LoopConfig("b", "g", "c", {"prefill.p": "prefill_work", "decode.p": "decode_work"}, "test")
    one = LoopConfig("b", "g", "c", {"decode.p": "decode_work"}, "test")
    assert consumer_overrides(two)["partition.assignment.strategy"] == "range"
    assert "partition.assignment.strategy" not in consumer_overrides(one)
    chosen = LoopConfig("b", "g", "c", two.topic_kinds, "test", consumer_overrides={"partition.assignment.strategy": "roundrobin"})
    assert consumer_overrides(chosen)["partition.assignment.strategy"] == "roundrobin"  # a caller's choice wins


def test_two_colocated_workers_each_own_prefill_and_decode_partitions(bootstrap: str, make_topic: Callable[..., str]) -> None:
    prefill, decode = make_topic("prefill", partitions=6), make_topic("decode", partitions=6)
    group = f"test.colo.{uuid.uuid4().hex[:8]}"
    loops: list[Any] = [
        WorkerLoop(LoopConfig(bootstrap, group, f"colo-{i}", {prefill: "prefill_work", decode: "decode_work"}, "test"), Idle())
        for i in range(2)
    ]
    try:
        for loop in loops:
            loop.consumer.subscribe([prefill, decode], on_assign=loop._on_assign, on_revoke=loop._on_revoke)
        deadline = time.time() + 60
        while time.time() < deadline:
            for loop in loops:
                loop.consumer.poll(0.2)
            if all(loop.assignment for loop in loops) and sum(len(loop.assignment) for loop in loops) == 12:
                break
        for loop in loops:
            topics = {topic: sum(1 for t, _ in loop.assignment if t == topic) for topic in (prefill, decode)}
            assert topics == {prefill: 3, decode: 3}, f"{loop.config.client_id} owns {sorted(loop.assignment)}"
    finally:
        for loop in loops:
            loop.consumer.close()


def test_a_completion_from_before_a_rebalance_that_gave_the_partition_back_is_not_a_crash() -> None:
    from confluent_kafka import TopicPartition

    from phaseroute.consumers.handler import Completion, WorkItem

    # clients are created but never used: nothing here talks to a broker
    loop = WorkerLoop(LoopConfig("127.0.0.1:1", "g", "c", {"prefill.p": "prefill_work", "decode.p": "decode_work"}, "test"), Idle())
    tp = ("prefill.p", 2)
    stale = Completion(WorkItem(tp, 0, "prefill_work", {}, 0.0, 0.0))
    loop._on_assign(None, [TopicPartition(*tp)])
    loop.offsets.taken(tp, 0)
    loop._on_revoke(None, [TopicPartition(*tp)])  # eager: every partition revoked ...
    loop._on_assign(None, [TopicPartition(*tp)])  # ... and the same one assigned again
    loop._finish([stale])  # its batch ran on: the offset is not held any more (it raised KeyError)
    assert loop.offsets.committable() == {}
    loop.offsets.taken(tp, 0)  # read again from the committed position
    loop._finish([stale])  # the old take finishing now makes the new take's work durable
    assert loop.offsets.committable() == {tp: 1}
    loop._finish([Completion(WorkItem(tp, 0, "prefill_work", {}, 0.0, 0.0))])  # the new take: nothing left to do
    assert loop.offsets.committable() == {tp: 1}
