"""A producer whose batches land all or nothing, together with the input offsets that made them.

Kafka's exactly-once for a consume-transform-produce loop (KIP-98, with KIP-447's fencing by
consumer group): ``commit_batch`` begins a transaction, produces the batch's records, adds the
input offsets with the consumer group metadata captured when the inputs were read, and commits.
Either every record becomes visible to ``read_committed`` readers and the offsets are committed,
or none of it happens.

Fencing: the group coordinator accepts the offsets only from a member of the group's current
generation. An instance that lost its partitions without knowing it yet (a pause longer than
the session timeout: a zombie) carries the metadata of a generation the group has left; its
transaction is refused and aborted, so none of its late records (a job's stale changelog record
after the new owner's) ever becomes visible. The caller then rewinds its state to what was
committed (``BatchOutcome.ABORTED``).

A process killed inside a transaction leaves it open until the broker aborts it after
``transaction.timeout.ms`` (here the caller's ``timeout_s``): until then ``read_committed``
readers of the partitions it wrote see nothing past it, and the next owner of its input
partitions waits for their committed offsets.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from phaseroute.consumers.kafka_clients import producer_config

log = logging.getLogger(__name__)
RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One record of a batch: ``value`` None is a tombstone; ``partition`` None lets the key pick it."""

    topic: str
    key: str
    value: bytes | None
    partition: int | None


class BatchOutcome(Enum):
    COMMITTED = "committed"  # the records visible, the offsets committed
    ABORTED = "aborted"  # none of it happened: rewind to the committed offsets
    STOPPED = "stopped"  # the caller is stopping; nothing of the batch happened


def _kafka_error(exc: KafkaException) -> KafkaError | None:
    return exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None


class TransactionalProducer:
    def __init__(self, bootstrap: str, transactional_id: str, timeout_s: float) -> None:
        self.transactional_id = transactional_id
        self.timeout_s = timeout_s
        self._config = producer_config(bootstrap, transactional_id) | {
            "transactional.id": transactional_id, "transaction.timeout.ms": int(timeout_s * 1000)}
        self._producer: Producer | None = None  # registered at the first batch (the broker may not answer yet)
        self.counts = {"committed": 0, "aborted": 0, "fenced": 0}

    def _ready(self) -> Producer:
        """The producer, registered under the transactional id (which aborts what an earlier one
        with the same id left open); raises KafkaException while the broker does not answer."""
        if self._producer is None:
            producer = Producer(self._config)
            producer.init_transactions(self.timeout_s)
            self._producer = producer
        return self._producer

    def commit_batch(self, records: Sequence[Outgoing], offsets: list[TopicPartition], group: Any,
                     stopping: threading.Event) -> BatchOutcome:
        """Produce ``records`` and commit ``offsets`` for the consumer group whose metadata is
        ``group``, in one transaction. A commit that times out is retried; any other failure aborts."""
        if not records and not offsets:
            return BatchOutcome.COMMITTED
        try:
            producer = self._ready()
            producer.begin_transaction()
            for r in records:
                self._produce(producer, r)
            if offsets:
                producer.send_offsets_to_transaction(offsets, group, self.timeout_s)
            while True:
                try:
                    producer.commit_transaction(self.timeout_s)
                    self.counts["committed"] += 1
                    return BatchOutcome.COMMITTED
                except KafkaException as exc:
                    err = _kafka_error(exc)
                    if err is None or not err.retriable():
                        raise
                    log.warning("transaction of %s: commit not confirmed yet (%s); asking again",
                                self.transactional_id, err.str())
                    if stopping.wait(RETRY_S):
                        self._abort()
                        return BatchOutcome.STOPPED
        except KafkaException as exc:
            self._failed(exc, len(records), offsets)
            return BatchOutcome.ABORTED

    @staticmethod
    def _produce(producer: Producer, r: Outgoing) -> None:
        placed = -1 if r.partition is None else r.partition
        while True:
            try:
                producer.produce(r.topic, value=r.value, key=r.key, partition=placed)
                return
            except BufferError:  # local queue full: let deliveries drain, then retry
                producer.poll(0.1)

    def _failed(self, exc: KafkaException, records: int, offsets: list[TopicPartition]) -> None:
        err = _kafka_error(exc)
        fenced = err is not None and err.code() in (KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID,
                                                     KafkaError.FENCED_INSTANCE_ID, KafkaError._FENCED)
        self.counts["fenced" if fenced else "aborted"] += 1
        where = sorted({(tp.topic, tp.partition) for tp in offsets})
        if fenced:
            log.warning("transaction of %s refused: this instance is no longer the group's owner of %s (%s); "
                        "its %d records are aborted", self.transactional_id, where, err.str() if err else exc, records)
        else:
            log.error("transaction of %s failed (%s); its %d records and offsets %s are aborted",
                      self.transactional_id, err.str() if err else exc, records, where)
        if err is not None and err.fatal():  # the producer is unusable: a new one under the same id next time
            self._producer = None
            return
        self._abort()

    def _abort(self) -> None:
        if self._producer is None:  # never registered: no transaction is open
            return
        try:
            self._producer.abort_transaction(self.timeout_s)
        except KafkaException:  # it cannot be aborted: a new producer under the same id aborts it
            log.exception("transaction of %s: abort failed; registering a new producer", self.transactional_id)
            self._producer = None
