"""End offsets of a topic's partitions, read through a broker that is still settling.

A view that reads a compacted topic "to its end" first asks each partition's high watermark.
Right after a broker (re)start, or a topic's creation, the partition's leader may not be
elected yet and the broker answers NOT_LEADER_FOR_PARTITION (or LEADER_NOT_AVAILABLE): a
transient state that the client retries for a produce or a fetch, but not for
``get_watermark_offsets``, which raised it and stopped the process that asked (the pipeline
bench, after it restarted its broker between two set-ups). ``end_offsets`` asks again until
``timeout_s``; an error that is not transient, or one that outlasts the timeout, is raised with
the topic and partition named.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

# what a broker answers while partition leadership settles (besides errors librdkafka marks retriable)
SETTLING = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
})


def transient(exc: KafkaException) -> bool:
    """Whether the error is one a settling broker gives (ask again) rather than a real refusal."""
    error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    return error is not None and (error.retriable() or error.code() in SETTLING)


def end_offsets(consumer: Any, partitions: Iterable[TopicPartition], timeout_s: float = 30.0,
                retry_every_s: float = 0.25) -> dict[int, int]:
    """Partition -> high watermark, each asked again on a transient error until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    ends: dict[int, int] = {}
    for tp in partitions:
        while True:
            try:
                ends[tp.partition] = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=max(1.0, min(10.0, deadline - time.monotonic())))[1]
                break
            except KafkaException as exc:
                if not transient(exc) or time.monotonic() >= deadline:
                    raise KafkaException(KafkaError(
                        exc.args[0].code() if exc.args and isinstance(exc.args[0], KafkaError) else KafkaError._FAIL,
                        f"end offset of {tp.topic}[{tp.partition}] not known after {timeout_s:.0f} s: {exc}")) from exc
                time.sleep(retry_every_s)
    return ends
