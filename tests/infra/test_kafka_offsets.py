"""End offsets through a settling broker: transient refusals are asked again, real ones named.

The retry rule is checked against a scripted stand-in for the consumer (a broker cannot be
made to refuse leadership on cue); the offsets themselves against the real broker.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from phaseroute.infra.kafka_offsets import end_offsets, transient


class _ScriptedConsumer:
    """Answers ``get_watermark_offsets`` from a script: an exception to raise, or a (low, high)."""

    def __init__(self, script: list[Any]) -> None:
        self.script, self.asked = list(script), 0

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        self.asked += 1
        answer = self.script.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def _refusal(code: int) -> KafkaException:
    return KafkaException(KafkaError(code, "Broker: refused"))


def test_a_partition_without_a_leader_yet_is_asked_again_until_it_answers() -> None:
    consumer = _ScriptedConsumer([_refusal(KafkaError.NOT_LEADER_FOR_PARTITION),
                                  _refusal(KafkaError.LEADER_NOT_AVAILABLE), (0, 7), (0, 3)])
    ends = end_offsets(consumer, [TopicPartition("profiles", 0), TopicPartition("profiles", 1)], retry_every_s=0.01)
    assert ends == {0: 7, 1: 3} and consumer.asked == 4


def test_a_real_refusal_is_raised_at_once_naming_the_partition() -> None:
    consumer = _ScriptedConsumer([_refusal(KafkaError.TOPIC_AUTHORIZATION_FAILED), (0, 1)])
    with pytest.raises(KafkaException, match=r"profiles\[2\]"):
        end_offsets(consumer, [TopicPartition("profiles", 2)], retry_every_s=0.01)
    assert consumer.asked == 1
    assert not transient(_refusal(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    assert transient(_refusal(KafkaError.NOT_LEADER_FOR_PARTITION))


def test_a_refusal_that_outlasts_the_timeout_is_raised() -> None:
    consumer = _ScriptedConsumer([_refusal(KafkaError.NOT_LEADER_FOR_PARTITION)] * 1000)
    with pytest.raises(KafkaException, match=r"pools\.heartbeat\[0\] not known after 0 s"):
        end_offsets(consumer, [TopicPartition("pools.heartbeat", 0)], timeout_s=0.2, retry_every_s=0.05)
    assert 2 <= consumer.asked < 1000


@pytest.mark.kafka
def test_the_end_offsets_of_a_real_topic(bootstrap: str, make_topic: Any) -> None:
    topic = make_topic("offsets", partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(5):
        producer.produce(topic, value=b"x", partition=i % 2)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "test-offsets", "enable.auto.commit": False})
    try:
        assert end_offsets(consumer, [TopicPartition(topic, 0), TopicPartition(topic, 1)]) == {0: 3, 1: 2}
    finally:
        consumer.close()
