"""confluent-kafka clients configured the one way phaseroute's data plane needs.

Producers are idempotent with ``acks=all`` (a retried send never duplicates) and use the
murmur2 partitioner so a key lands on the same partition as with Faust's aiokafka.
Consumers never auto-commit (offsets are committed only after outputs are durably produced),
use cooperative-sticky assignment (a worker joining moves only some partitions), and poll
with a short fetch wait so light traffic is not delayed by the 500 ms default.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer

log = logging.getLogger(__name__)


class DeliveryError(RuntimeError):
    """A produced message was not acknowledged by the cluster; nothing is committed."""


def producer_config(bootstrap: str, client_id: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        "compression.type": "lz4",  # Faust's aiokafka reads it through cramjam
        "message.max.bytes": 16 * 1024 * 1024,
    }


def consumer_config(bootstrap: str, group_id: str, client_id: str, **overrides: Any) -> dict[str, Any]:
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "client.id": client_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
        "fetch.wait.max.ms": 50,
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 1_000,
        # a long prefill batch must not get the worker kicked out of its group
        "max.poll.interval.ms": 600_000,
    }
    config.update(overrides)
    return config


class TrackedProducer:
    """A producer that remembers delivery failures so ``flush_or_raise`` can refuse to go on."""

    def __init__(self, bootstrap: str, client_id: str) -> None:
        self._producer = Producer(producer_config(bootstrap, client_id))
        self._failures: list[str] = []

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self._failures.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")

    def produce(self, topic: str, key: str | bytes | None, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=self._on_delivery)
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                self._producer.poll(0.1)
        self._producer.poll(0)

    def flush_or_raise(self, timeout_s: float = 30.0) -> None:
        """Wait until every produced message is acknowledged; raise if any was not."""
        remaining = self._producer.flush(timeout_s)
        if remaining:
            raise DeliveryError(f"{remaining} message(s) not acknowledged within {timeout_s:.0f} s")
        if self._failures:
            failures, self._failures = self._failures, []
            raise DeliveryError("delivery failed: " + "; ".join(failures[:5]))


def new_consumer(bootstrap: str, group_id: str, client_id: str, **overrides: Any) -> Consumer:
    return Consumer(consumer_config(bootstrap, group_id, client_id, **overrides))
