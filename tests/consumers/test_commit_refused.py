"""A commit the group refuses while it rebalances does not stop a worker and loses nothing.

When a worker joins or leaves, the broker refuses commits made with the old group generation
(ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID). The loop has already made
its outputs durable, so it keeps the offsets pending and commits them with the next commit.
Found by the scaling test, where a joining decode worker made a running one crash on such a
commit. A real broker carries the work; the refusal itself is injected (named fault
injection: a wrapper around the real consumer whose ``commit`` raises the broker's error),
because the race that produces it cannot be scheduled on demand.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from phaseroute.consumers.handler import Completion, Output, WorkItem
from phaseroute.consumers.loop import LoopConfig, WorkerLoop
from phaseroute.infra import provision, topics
from tests.consumers.work import prefill_work, produce, prompts


class DoneAtOnce:
    """A handler that finishes every item as soon as it is admitted, with no outputs."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def capacity(self) -> int:
        return 8

    def batch_ready(self, waited_s: float) -> bool:
        return False

    def due_in(self, now: float) -> float:
        return 0.0

    def admit(self, items: list[WorkItem]) -> list[Completion]:
        self.seen += [item.offset for item in items]
        return [Completion(item) for item in items]

    def step(self) -> list[Completion]:
        return []

    def in_flight(self) -> int:
        return 0

    def drop(self, tps: list[Any]) -> int:
        return 0

    def telemetry(self) -> list[Output]:
        return []

    def status(self) -> dict[str, Any]:
        return {}


class CommitRefusingConsumer:
    """Fault injection: the real consumer, except that ``commit`` raises ``code`` while ``refuse`` is set."""

    def __init__(self, real: Consumer, code: int) -> None:
        self.real, self.code, self.refuse = real, code, True

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        if self.refuse:
            raise KafkaException(KafkaError(self.code))
        return self.real.commit(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _loop(bootstrap: str, code: int) -> tuple[WorkerLoop, DoneAtOnce, CommitRefusingConsumer, str, str]:
    pool = f"commit-{uuid.uuid4().hex[:6]}"
    provision.provision(bootstrap, list(topics.pool_topics(pool)))
    topic = f"prefill.{pool}"
    produce(bootstrap, topic, [(f"j/r{i:04d}", "prefill_work",
                                prefill_work("j", i, p, pool, 4, decode_pool=None, colocated=True))
                               for i, p in enumerate(prompts(3))])
    handler = DoneAtOnce()
    group = f"{pool}-group"
    loop = WorkerLoop(LoopConfig(bootstrap, group, f"{pool}-0", {topic: "prefill_work"}, "test"), handler)
    refusing = CommitRefusingConsumer(loop.consumer, code)
    loop.consumer = refusing  # type: ignore[assignment]
    return loop, handler, refusing, topic, group


def _wait(condition, timeout_s: float = 60.0) -> None:
    deadline = time.time() + timeout_s
    while not condition():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def _committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        done = consumer.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        return sum(max(tp.offset, 0) for tp in done)
    finally:
        consumer.close()


@pytest.mark.parametrize("code", [KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS])
def test_refused_commit_keeps_the_worker_running_and_commits_later(bootstrap, code) -> None:
    loop, handler, refusing, topic, group = _loop(bootstrap, code)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    try:
        _wait(lambda: len(handler.seen) == 3 and loop.stats["commits_refused"] >= 2)
        assert thread.is_alive() and loop.stats["commits"] == 0
        refusing.refuse = False  # the rebalance is over
        _wait(lambda: loop.stats["commits"] >= 1)
    finally:
        loop.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert _committed(bootstrap, group, topic) == 3  # every finished item, once the group took commits again


def test_other_commit_errors_still_stop_the_worker(bootstrap) -> None:
    loop, handler, _refusing, _topic, _group = _loop(bootstrap, KafkaError.GROUP_AUTHORIZATION_FAILED)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            loop.run()
        except KafkaException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    assert failure and failure[0].args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
