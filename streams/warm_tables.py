"""A standby's warm copy of the control plane's tables, so that taking over reads only the tail.

Without it, an instance that takes the control lease starts its Faust app with empty tables and
Faust rebuilds them from the changelogs from their start: with 100,000 requests in flight that
was about 400,000 changelog records and 56 s (``bench control --kill-after``), on top of the
session timeout. With it, life of a table's state in a standby:
1. before the lease, ``ChangelogMirror`` follows every changelog partition of the tables
   (``jobs``, ``requests``, ``tenants``, ``prompts``) on a background thread, decoding keys and
   values as Faust does (JSON), applying tombstones, and noting the last offset applied per
   partition;
2. when the instance takes the lease, ``hand_over`` stops the thread (what it applied is a
   prefix of each partition) and leaves the state and offsets for the tables;
3. the app's tables use the ``warm://`` store (``WarmStore``): it starts from the handed-over
   state and tells Faust's recovery the offset it holds per partition, so recovery reads only
   the records written since (the dead instance's last writes), then the app restores the core
   as after any restart.
An instance that takes the lease before its copy caught up hands over what it has; recovery
reads the rest. Nothing is skipped: each partition is a prefix plus the tail after it.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from faust import stores
from faust.stores import memory

from phaseroute.consumers.kafka_clients import LONG_POLL
from phaseroute.infra.kafka_security import with_cluster_config
from phaseroute.infra.topics import CONTROL_TABLES, changelog_topic

log = logging.getLogger(__name__)
SCHEME = "warm"
STORE_URL = f"{SCHEME}://copy"  # a URL with a host: Faust takes a bare "warm://" for no store given


@dataclass
class TableCopy:
    """One table as its changelog says: key -> value, each key's partition, offsets applied."""

    data: dict[Any, Any] = field(default_factory=dict)
    partition_of: dict[Any, int] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)  # partition -> last offset applied

    def apply(self, partition: int, offset: int, raw_key: bytes | None, raw_value: bytes | None) -> None:
        if raw_key is not None:
            key = json.loads(raw_key)
            if raw_value is None:
                self.data.pop(key, None)
                self.partition_of.pop(key, None)
            else:
                self.data[key] = json.loads(raw_value)
                self.partition_of[key] = partition
        self.offsets[partition] = offset


_HANDED_OVER: dict[str, TableCopy] = {}  # changelog topic -> its copy, for the tables to take


class ChangelogMirror:
    """Follows the changelogs of ``tables`` from their start (see the module docstring)."""

    def __init__(self, bootstrap: str, tables: Iterable[str] = CONTROL_TABLES,
                 cluster: dict[str, str] | None = None) -> None:
        self.copies = {changelog_topic(t): TableCopy() for t in tables}
        self._consumer = Consumer(with_cluster_config({
            "bootstrap.servers": bootstrap, "group.id": f"warm-standby-{uuid.uuid4().hex}",
            "enable.auto.commit": False, **LONG_POLL}, cluster))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="warm-tables", daemon=True)
        self.applied = 0

    def start(self) -> None:
        parts = []
        for topic in self.copies:
            metadata = self._consumer.list_topics(topic, timeout=15).topics[topic]
            parts += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions]
        self._consumer.assign(parts)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(1000, 0.2):
                if msg.error():
                    continue
                try:
                    self.copies[str(msg.topic())].apply(msg.partition() or 0, msg.offset() or 0, msg.key(), msg.value())
                    self.applied += 1
                except (ValueError, KeyError):  # not what Faust writes: recovery reads that partition whole
                    log.exception("warm tables: a record of %s[%s]@%s is not JSON; not kept",
                                  msg.topic(), msg.partition(), msg.offset())

    def hand_over(self) -> dict[str, int]:
        """Stop following; leave the copies for the ``warm://`` tables. Records per table."""
        self._stop.set()
        self._thread.join(timeout=30)
        self._consumer.close()
        _HANDED_OVER.update(self.copies)
        return {topic: len(copy.data) for topic, copy in self.copies.items()}


class WarmStore(memory.Store):  # type: ignore[type-arg]
    """Faust's in-memory store, started from a handed-over copy of its changelog."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # (Faust's own __post_init__ runs before the table is known)
        copy = _HANDED_OVER.pop(changelog_topic(self.table_name), None)
        self._offsets: dict[int, int] = {}
        if copy is not None:
            self.data.update(copy.data)
            self._key_partition.update(copy.partition_of)
            self._offsets = dict(copy.offsets)

    def persisted_offset(self, tp: Any) -> int | None:
        """The last changelog offset already in the table: recovery reads from the next one."""
        return self._offsets.get(tp.partition)


stores.STORES.aliases[SCHEME] = f"{__name__}:WarmStore"
