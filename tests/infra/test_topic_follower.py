"""TopicFollower on the real broker: every good record of every partition reaches the view, a
record that is not Avro of its kind is skipped with a warning naming where it is (the view goes
on), and ``caught_up`` is set once what was there at start is read; records written after that
are followed too."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer

from phaseroute.infra.topic_follower import TopicFollower
from phaseroute.schemas import serde
from phaseroute.schemas.examples import example

pytestmark = pytest.mark.kafka


def test_a_view_reads_every_partition_skips_what_it_cannot_decode_and_follows(
    bootstrap: str, make_topic: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    topic = make_topic("follow", partitions=3)
    command = example("job_command")
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(6):
        producer.produce(topic, serde.encode("job_command", {**command, "job_id": f"j{i}"}), key=f"j{i}", partition=i % 3)
    producer.produce(topic, b"not avro at all", key="bad", partition=1)
    producer.flush(30)
    seen: list[dict[str, Any]] = []
    follower = TopicFollower(bootstrap, topic, "job_command", seen.append, service="test-view")
    with caplog.at_level(logging.WARNING, logger="phaseroute.infra.topic_follower"):
        follower.start()
        try:
            assert follower.caught_up.wait(30), "caught_up was never set"
            assert sorted(r["job_id"] for r in seen) == [f"j{i}" for i in range(6)]
            producer.produce(topic, serde.encode("job_command", {**command, "job_id": "later"}), key="later", partition=2)
            producer.flush(30)
            deadline = time.monotonic() + 30
            while len(seen) < 7 and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            follower.stop()
    assert seen[-1]["job_id"] == "later" and len(seen) == 7
    [warning] = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert f"test-view: {topic}[1]@" in warning
