"""Following a topic from its beginning on a background thread: what every materialized view
reads (the router's profiles and pool states, the drift monitor's restored path states, the
API's tenant registry and jobs view).

Each record is decoded as ``kind`` and handed to ``on_record``. An undecodable record is
skipped with a warning naming where it is: a view must not stop on one bad record, and its
writer dead-letters what it cannot encode. ``caught_up`` is set once the end offsets seen at
``start`` are read (or each partition's end is reached: one written in transactions ends in a
marker that is never delivered), so a view can wait until it holds what was there when it
started. The consumer uses the cluster's security settings and a fresh group (no offsets are
committed).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from phaseroute.consumers.kafka_clients import LONG_POLL
from phaseroute.infra.kafka_offsets import end_offsets
from phaseroute.infra.kafka_security import with_cluster_config
from phaseroute.schemas.deadletter import Rejected, safe_decode

log = logging.getLogger(__name__)


class TopicFollower:
    """Reads every partition of ``topic`` from the beginning and hands each record to ``on_record``
    (``service`` names the reader in the warnings; ``settings`` are extra librdkafka settings)."""

    def __init__(self, bootstrap: str, topic: str, kind: str, on_record: Callable[[dict[str, Any]], None], *,
                 service: str = "view", settings: Mapping[str, Any] | None = None) -> None:
        self.topic, self.kind, self.on_record, self.service = topic, kind, on_record, service
        self.consumer = Consumer(with_cluster_config({
            "bootstrap.servers": bootstrap, "group.id": f"view-{uuid.uuid4().hex}", "enable.auto.commit": False,
            **LONG_POLL, "enable.partition.eof": True, **(settings or {})}))
        self._stop = threading.Event()
        self.caught_up = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"follow-{topic}", daemon=True)
        self._ends: dict[int, int] = {}

    def start(self) -> None:
        metadata = self.consumer.list_topics(self.topic, timeout=15).topics[self.topic]
        parts = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in metadata.partitions]
        self._ends = end_offsets(self.consumer, parts)
        self.consumer.assign(parts)
        self._thread.start()

    def _run(self) -> None:
        positions: dict[int, int] = {}
        while not self._stop.is_set():
            msg = self.consumer.poll(0.2)
            error = None if msg is None else msg.error()
            if msg is not None and error is not None and error.code() == KafkaError._PARTITION_EOF:
                # read to the end: a partition written in transactions ends in a marker never delivered
                partition = msg.partition() or 0
                positions[partition] = max(positions.get(partition, 0), self._ends.get(partition, 0))
            elif msg is not None and error is None:
                partition, offset = msg.partition() or 0, msg.offset() or 0
                positions[partition] = offset + 1
                decoded = safe_decode(msg.value(), msg.key(), topic=self.topic, partition=partition, offset=offset,
                                      service=self.service, now_ms=int(time.time() * 1000), expected_kind=self.kind)
                if isinstance(decoded, Rejected):
                    log.warning("%s: %s[%d]@%d skipped: %s", self.service, self.topic, partition, offset, decoded.error)
                else:
                    self.on_record(decoded.record)
            if not self.caught_up.is_set() and all(positions.get(p, 0) >= end for p, end in self._ends.items()):
                self.caught_up.set()
        self.consumer.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
