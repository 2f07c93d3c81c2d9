"""Every producer checks delivery: a record the cluster refuses is an error that says what failed,
never silence (issue 16: a 10 MB job to jobs.submitted was refused with MSG_SIZE_TOO_LARGE and
`publish` reported nothing)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from phaseroute.consumers.kafka_clients import DeliveryError, TrackedProducer, publish_one

pytestmark = pytest.mark.kafka
MB = 1024 * 1024


def test_a_10_mb_record_to_jobs_submitted_is_refused_with_a_clear_error(bootstrap: str) -> None:
    value = os.urandom(10 * MB)  # incompressible: lz4 cannot bring it under the broker's limit
    with pytest.raises(DeliveryError) as err:
        publish_one(bootstrap, "jobs.submitted", "job-too-large", value)
    message = str(err.value)
    assert "jobs.submitted" in message and "10,485,760 bytes" in message
    assert "Message size too large" in message and "max.message.bytes" in message and "input file" in message


def test_a_record_over_the_clients_own_limit_is_refused_before_sending(bootstrap: str, make_topic: Callable[..., str]) -> None:
    topic = make_topic("too-large")
    with pytest.raises(DeliveryError, match=rf"{topic}: a record of 20,971,520 bytes was not sent: .*max.message.bytes"):
        publish_one(bootstrap, topic, "k", os.urandom(20 * MB))


def test_a_failure_among_good_records_is_reported_and_the_good_ones_land(bootstrap: str, make_topic: Callable[..., str]) -> None:
    from confluent_kafka import Consumer, TopicPartition

    topic = make_topic("mixed")
    producer = TrackedProducer(bootstrap, "test-delivery")
    producer.produce(topic, "a", b"small")
    producer.produce(topic, "b", os.urandom(2 * MB))
    producer.produce(topic, "c", b"small too")
    with pytest.raises(DeliveryError, match=r"refused a record of 2,097,152 bytes"):
        producer.flush_or_raise(30)
    producer.flush_or_raise(5)  # reported once: the producer goes on
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{topic}", "enable.auto.commit": False})
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    assert high == 2


def test_an_unknown_topic_is_an_error_not_silence(bootstrap: str) -> None:
    with pytest.raises(DeliveryError, match="no-such-topic-for-phaseroute"):
        publish_one(bootstrap, "no-such-topic-for-phaseroute", "k", b"v", timeout_s=5)
