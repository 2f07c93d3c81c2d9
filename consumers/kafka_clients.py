"""confluent-kafka clients configured the one way phaseroute's data plane needs.

Producers are idempotent with ``acks=all`` (a retried send never duplicates) and use the
murmur2 partitioner so a key lands on the same partition as with Faust's aiokafka. Every send
is checked: ``TrackedProducer`` collects each delivery report, and ``flush_or_raise`` raises
``DeliveryError`` naming the topic, the record's size and the broker's reason (a record larger
than the topic's ``max.message.bytes`` is refused, not dropped in silence); ``publish_one`` is
the one-record form for commands.
Consumers never auto-commit (offsets are committed only after outputs are durably produced)
and use cooperative-sticky assignment (a worker joining moves only some partitions).

The fetch wait: a fetch with nothing to return is held by the broker until a record arrives or
``fetch.wait.max.ms`` passes, so a longer wait does not delay records, it only makes an idle
consumer ask less often (measured: a read_committed consumer at 500 ms got a record 2 ms after
its transaction's commit returned). Consumers that only follow a topic (sinks, table readers,
the drift monitor) take ``LONG_POLL``: on 2 cores the idle stack's fetches every 50-100 ms cost
the local broker ~0.05 of a core (measured with its request log). The loops that pause, resume
or seek (workers, the control plane's tracking loop and admitter) keep 50 ms until a long wait
is measured in them: the reason first given for keeping them short (a resumed partition waiting
for a long fetch in flight) did not hold in a small test, where a record sent right after every
partition was paused and resumed arrived after 648 ms at 50 ms and 1 ms at 500 ms.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from phaseroute.infra.kafka_security import with_cluster_config

log = logging.getLogger(__name__)


class DeliveryError(RuntimeError):
    """A produced message was not acknowledged by the cluster; nothing is committed."""


def producer_config(bootstrap: str, client_id: str) -> dict[str, Any]:
    return with_cluster_config({
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        "compression.type": "lz4",  # Faust's aiokafka reads it through cramjam
        "message.max.bytes": 16 * 1024 * 1024,
    })


LONG_POLL = {"fetch.wait.max.ms": 500}  # consumers that only follow topics (see the module's docstring)


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
    return with_cluster_config(config)


class TrackedProducer:
    """A producer that remembers delivery failures so ``flush_or_raise`` can refuse to go on."""

    def __init__(self, bootstrap: str, client_id: str) -> None:
        self._producer = Producer(producer_config(bootstrap, client_id))
        self._bootstrap = bootstrap
        self._failures: list[str] = []
        self._pending: Counter[str] = Counter()  # topic -> records not yet reported

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        self._pending[msg.topic()] -= 1
        if err is not None:
            size = len(msg.value() or b"")
            self._failures.append(f"{msg.topic()}[{msg.partition()}] refused a record of {size:,} bytes: {err.str()}"
                                  + _hint(err.code()))

    def produce(self, topic: str, key: str | bytes | None, value: bytes | None, partition: int | None = None) -> None:
        """Send ``value`` (None: a tombstone); ``partition`` None: the key's murmur2 hash picks it."""
        placed = -1 if partition is None else partition  # -1: librdkafka's "unassigned", the partitioner decides
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, partition=placed, on_delivery=self._on_delivery)
                self._pending[topic] += 1
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                self._producer.poll(0.1)
            except KafkaException as exc:  # refused before sending (too large for the client, unknown topic...)
                err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                reason = err.str() if err is not None else str(exc)
                raise DeliveryError(f"{topic}: a record of {len(value or b''):,} bytes was not sent: {reason}"
                                    + (_hint(err.code()) if err is not None else "")) from None
        self._producer.poll(0)

    def flush_or_raise(self, timeout_s: float = 30.0) -> None:
        """Wait until every produced message is acknowledged; raise if any was not."""
        remaining = self._producer.flush(timeout_s)
        if remaining:
            waiting = ", ".join(f"{n} to {t}" for t, n in sorted(self._pending.items()) if n > 0)
            raise DeliveryError(f"{remaining} message(s) ({waiting}) not acknowledged by {self._bootstrap} within "
                                f"{timeout_s:.0f} s: is the broker up, and does the topic exist?")
        if self._failures:
            failures, self._failures = self._failures, []
            raise DeliveryError("delivery failed: " + "; ".join(failures[:5]))


def _hint(code: int) -> str:
    if code == KafkaError.MSG_SIZE_TOO_LARGE:  # the broker's answer and the client's own check alike
        return (" (larger than the topic's max.message.bytes or the client's message.max.bytes; "
                "send large batches as an input file instead of inline requests)")
    return ""


def publish_one(bootstrap: str, topic: str, key: str | bytes | None, value: bytes, client_id: str = "phaseroute-cli",
                timeout_s: float = 30.0) -> None:
    """Send one record and wait for the cluster's acknowledgement; DeliveryError says what failed."""
    producer = TrackedProducer(bootstrap, client_id)
    producer.produce(topic, key, value)
    producer.flush_or_raise(timeout_s)


def new_consumer(bootstrap: str, group_id: str, client_id: str, **overrides: Any) -> Consumer:
    return Consumer(consumer_config(bootstrap, group_id, client_id, **overrides))
