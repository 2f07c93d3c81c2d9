"""Following a topic from the beginning in a background thread (the tenant registry, the jobs
view): every record decoded and handed to a callback; undecodable records are skipped (their
writer dead-letters them); ``caught_up`` is set once the end offsets seen at start are read.
Uses the cluster's security settings (``kafka_io.client_config``)."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

from phaseroute.api.kafka_io import client_config
from phaseroute.schemas import serde

log = logging.getLogger(__name__)


class Follower:
    def __init__(self, bootstrap: str, topic: str, kind: str, on_record: Callable[[dict[str, Any]], None]) -> None:
        from confluent_kafka import Consumer

        self.topic, self.kind, self.on_record = topic, kind, on_record
        self.consumer = Consumer(client_config(bootstrap, **{"group.id": f"view-{uuid.uuid4().hex}",
                                                             "enable.auto.commit": False, "fetch.wait.max.ms": 100}))
        self.caught_up = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"follow-{topic}", daemon=True)
        self._ends: dict[int, int] = {}

    def start(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        from phaseroute.infra.kafka_offsets import end_offsets

        meta = self.consumer.list_topics(self.topic, timeout=15).topics[self.topic]
        parts = [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in meta.partitions]
        self._ends = end_offsets(self.consumer, parts)
        self.consumer.assign(parts)
        self._thread.start()

    def _run(self) -> None:
        positions: dict[int, int] = {}
        while not self._stop.is_set():
            msg = self.consumer.poll(0.2)
            if msg is not None and not msg.error():
                partition, offset = msg.partition() or 0, msg.offset() or 0
                positions[partition] = offset + 1
                try:
                    record = serde.decode(msg.value() or b"", self.kind)[1]
                except Exception as exc:
                    log.warning("%s[%d]@%d skipped: %s", self.topic, partition, offset, exc)
                else:
                    self.on_record(record)
            if not self.caught_up.is_set() and all(positions.get(p, 0) >= end for p, end in self._ends.items()):
                self.caught_up.set()
        self.consumer.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
