"""The drift monitor on Kafka: pools from heartbeats, canary results in, its records out.

Life of a canary result through the service: a decode worker (or a colocated one) writes the
result of a canary request to ``canary.results``; ``run_once`` reads it (from the end of the
topic at start: a round open before a restart is given up by its time-out, not resumed), an
undecodable record is skipped, a decoded one joins its round (``DriftMonitor.on_result``); then
``DriftMonitor.tick`` closes the rounds that are due and starts those of the paths due again,
against the pools alive in the heartbeats (``PoolView``), and what it sends is produced and
flushed before the next read. ``start`` first restores every path's last state from the
compacted ``profiles`` topic.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from phaseroute.consumers.drift_monitor import DriftMonitor, MonitorConfig
from phaseroute.consumers.kafka_clients import LONG_POLL
from phaseroute.infra import topics
from phaseroute.infra.kafka_offsets import end_offsets
from phaseroute.infra.kafka_security import with_cluster_config
from phaseroute.schemas.ops_records import PoolHeartbeat, ProfileRow
from phaseroute.schemas.records import Result

log = logging.getLogger(__name__)


class MonitorService:
    """The monitor on Kafka: pools from heartbeats, results from ``canary.results``, records out."""

    def __init__(self, bootstrap: str, config: MonitorConfig, dead_after_s: float = 8.0) -> None:
        from phaseroute.consumers.kafka_clients import TrackedProducer
        from phaseroute.infra.topic_follower import TopicFollower
        from phaseroute.streams.views import PoolView

        self.bootstrap = bootstrap
        self.producer = TrackedProducer(bootstrap, f"drift-monitor.{uuid.uuid4().hex[:6]}")
        self.monitor = DriftMonitor(config, self._send)
        self.pools = PoolView(dead_after_s=dead_after_s)
        self.follower = TopicFollower(bootstrap, topics.POOLS_HEARTBEAT, PoolHeartbeat.KIND, self.pools.on_record)
        self.consumer: Any = None

    def _send(self, topic: str, key: str, kind: str, record: dict[str, Any]) -> None:
        from phaseroute.schemas import serde

        self.producer.produce(topic, key, serde.encode(kind, record))

    def start(self, restore_timeout_s: float = 15.0) -> None:
        """Restore path states from ``profiles``, follow heartbeats, read results from now on."""
        from confluent_kafka import Consumer, TopicPartition

        from phaseroute.infra.topic_follower import TopicFollower

        seen: list[dict[str, Any]] = []
        profiles = TopicFollower(self.bootstrap, self.monitor.config.profiles_topic, ProfileRow.KIND, seen.append)
        profiles.start()
        profiles.caught_up.wait(restore_timeout_s)
        profiles.stop()
        log.info("drift monitor: %d path state(s) restored", self.monitor.restore(seen))
        self.follower.start()
        self.consumer = Consumer(with_cluster_config({
            "bootstrap.servers": self.bootstrap, "group.id": f"drift-monitor-{uuid.uuid4().hex}",
            "enable.auto.commit": False, **LONG_POLL}))
        results = topics.CANARY_RESULTS
        parts = self.consumer.list_topics(results, timeout=15).topics[results].partitions
        ends = end_offsets(self.consumer, [TopicPartition(results, p) for p in parts])
        self.consumer.assign([TopicPartition(results, p, end) for p, end in ends.items()])

    def run_once(self, poll_s: float = 0.5, now: float | None = None) -> None:
        from phaseroute.schemas.deadletter import Rejected, safe_decode

        for msg in self.consumer.consume(256, poll_s):
            if msg.error() is None:
                decoded = safe_decode(msg.value(), msg.key(), topic=msg.topic(), partition=msg.partition(),
                                      offset=msg.offset(), service="drift-monitor", now_ms=int(time.time() * 1000),
                                      expected_kind=Result.KIND)
                if not isinstance(decoded, Rejected):
                    self.monitor.on_result(decoded.record)
        now = time.time() if now is None else now
        self.monitor.tick(self.pools.states(now, {}, {}).values(), now)
        self.producer.flush_or_raise()

    def close(self) -> None:
        self.follower.stop()
        if self.consumer is not None:
            self.consumer.close()
        self.producer.flush_or_raise()
