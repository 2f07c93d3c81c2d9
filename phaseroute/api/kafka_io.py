"""Short-lived Kafka reads and writes for the API and the client commands, with one clear
error when the cluster does not answer (not a traceback and a page of librdkafka lines).

- ``publish``: produce records and wait for every acknowledgement (idempotent producer,
  ``acks=all``, murmur2 partitioner so keys land where Faust reads them).
- ``read_latest``: the latest record per key of a (compacted) topic, read from the beginning
  up to the end offsets seen at the start.
librdkafka's own log lines go to a silent Python logger; failures surface as
``BrokerUnavailable`` naming the bootstrap servers.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from phaseroute.schemas import serde

_quiet = logging.getLogger("phaseroute.kafka.librdkafka")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False
QUIET_CLIENT: dict[str, Any] = {"logger": _quiet, "socket.connection.setup.timeout.ms": 5000}
"""librdkafka settings of the API's clients: its log lines silenced, a bounded connection wait."""


class BrokerUnavailable(RuntimeError):
    """The Kafka cluster did not answer in time."""


def _unavailable(bootstrap: str, what: str, timeout_s: float) -> BrokerUnavailable:
    return BrokerUnavailable(
        f"the Kafka cluster at {bootstrap} did not answer within {timeout_s:.0f} s ({what}); is it running? "
        "(`phaseroute up` starts the local broker; --bootstrap-servers / PHASEROUTE_BOOTSTRAP_SERVERS names another)")


def client_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    """librdkafka settings: the cluster's security settings (``PHASEROUTE_KAFKA_CLIENT_CONFIG``)
    under the caller's own."""
    from phaseroute.infra.kafka_security import with_cluster_config

    return with_cluster_config({"bootstrap.servers": bootstrap, **QUIET_CLIENT, **extra})


def publish(bootstrap: str, messages: Iterable[tuple[str, str, str, dict[str, Any]]], timeout_s: float = 30.0) -> None:
    """Produce each ``(topic, key, kind, record)`` and wait until all are acknowledged."""
    from confluent_kafka import Producer

    failures: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(f"{msg.topic()}: {err.str()}")

    producer = Producer(client_config(bootstrap, **{
        "enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random",
        "message.max.bytes": 8 * 1024 * 1024, "message.timeout.ms": int(timeout_s * 1000)}))
    for topic, key, kind, record in messages:
        producer.produce(topic, key=key.encode(), value=serde.encode(kind, record), on_delivery=on_delivery)
        producer.poll(0)
    remaining = producer.flush(timeout_s + 5)
    if remaining or failures:
        if remaining or any("timed out" in f.lower() or "transport" in f.lower() for f in failures):
            raise _unavailable(bootstrap, "publishing", timeout_s)
        raise RuntimeError(f"the cluster at {bootstrap} refused: {'; '.join(failures[:3])}")


def read_latest(bootstrap: str, topic: str, kind: str, key_of: Callable[[dict[str, Any]], str],
                newer: Callable[[dict[str, Any], dict[str, Any]], bool] | None = None,
                timeout_s: float = 15.0) -> dict[str, dict[str, Any]]:
    """The latest record per key: a later offset wins, or ``newer(candidate, held)`` decides."""
    from confluent_kafka import (
        OFFSET_BEGINNING,
        Consumer,
        KafkaError,
        KafkaException,
        TopicPartition,
    )

    from phaseroute.infra.kafka_offsets import end_offsets

    consumer = Consumer(client_config(bootstrap, **{
        "group.id": f"read-{uuid.uuid4().hex}", "enable.auto.commit": False, "fetch.wait.max.ms": 50,
        "enable.partition.eof": True}))
    try:
        try:
            meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
            if meta.error is not None:
                raise RuntimeError(f"topic {topic!r} is not there ({meta.error.str()}); run `phaseroute up` or provision the topics")
            parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions]
            ends = end_offsets(consumer, parts, timeout_s)
        except KafkaException:
            raise _unavailable(bootstrap, f"reading {topic}", timeout_s) from None
        consumer.assign(parts)
        latest: dict[str, dict[str, Any]] = {}
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.time() + timeout_s + 15
        while len(done) < len(ends):
            if time.time() > deadline:
                raise _unavailable(bootstrap, f"reading {topic} to its end", timeout_s)
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:  # the end: a partition written in transactions ends in a marker never delivered
                if error.code() == KafkaError._PARTITION_EOF:
                    done.add(msg.partition() or 0)
                continue
            partition, offset, value = msg.partition() or 0, msg.offset() or 0, msg.value() or b""
            try:
                record = serde.decode(value, kind)[1]
            except Exception:
                record = None
            if record is not None:
                key = key_of(record)
                if key not in latest or newer is None or newer(record, latest[key]):
                    latest[key] = record
            if offset + 1 >= ends[partition]:
                done.add(partition)
        return latest
    finally:
        consumer.close()
