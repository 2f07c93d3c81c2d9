"""The control plane's lease: one active control plane at a time, standbys ready to take over.

Life of a ``phaseroute control`` instance through the lease:
1. before it starts its Faust app it joins the consumer group ``phaseroute-control-lease`` on
   the one-partition topic ``control.lease`` (no records: only the assignment matters);
2. the instance the group assigns that partition to is the **active** control plane: it starts
   the Faust app (admission, the fair scheduler, the router, the tracker); every other
   instance is a **standby**: its process runs, its model catalogue is loaded, and it waits;
3. assignment is cooperative-sticky, so an instance that joins never moves the lease (the
   active one keeps dispatching while standbys come and go);
4. when the active instance dies (kill -9, its machine lost) the group expires its session
   after ``session_timeout_s`` and hands the partition to a standby, which starts its Faust
   app: its tables are rebuilt from their changelogs (VTC counters, in-flight counts, the
   queued requests) and the core restored from them, as after a restart. Work the dead one
   had sent is sent again under the same attempt ids, and results are deduplicated by
   request id, so a takeover runs nothing twice to completion;
5. an active instance stopped by SIGTERM leaves the group as it closes, so a standby takes
   over at once; one that *loses* the lease while it runs (cut off from the brokers for
   longer than its session) stops at once, since another instance may be dispatching by
   then (``on_lost``: ``phaseroute control`` starts itself again as a standby).

``lease_members`` reads the group from the broker: which instance holds the lease and which
wait (``phaseroute pools`` shows it).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from phaseroute.infra.group_admin import describe_group
from phaseroute.infra.kafka_security import with_cluster_config
from phaseroute.infra.topics import CONTROL_LEASE, CONTROL_LEASE_GROUP

log = logging.getLogger(__name__)
POLL_S = 0.5


def instance_id(name: str) -> str:
    """The client id an instance joins the lease group with: its name, host and PID."""
    return f"{name}@{socket.gethostname()}:{os.getpid()}"


class ControlLease:
    """Membership of the lease group, kept by a background thread (see the module docstring)."""

    def __init__(self, bootstrap: str, name: str, session_timeout_s: float,
                 on_lost: Callable[[str], None], cluster: dict[str, str] | None = None,
                 topic: str = CONTROL_LEASE, group: str = CONTROL_LEASE_GROUP) -> None:
        self.name, self.topic, self.group = name, topic, group
        self._on_lost = on_lost
        self._held = threading.Event()
        self._closing = threading.Event()
        self.held_since: float | None = None
        session_ms = int(session_timeout_s * 1000)
        self._consumer = Consumer(with_cluster_config({
            "bootstrap.servers": bootstrap, "group.id": group, "client.id": instance_id(name),
            "partition.assignment.strategy": "cooperative-sticky", "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": max(500, session_ms // 5), "enable.auto.commit": False,
            "auto.offset.reset": "latest", "log_level": 4,
        }, cluster))
        self._consumer.subscribe([topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost)
        self._thread = threading.Thread(target=self._poll, name="control-lease", daemon=True)
        self._thread.start()

    @property
    def held(self) -> bool:
        return self._held.is_set()

    def _poll(self) -> None:
        while not self._closing.is_set():
            try:
                self._consumer.poll(POLL_S)  # the topic has no records: polling keeps the membership
            except (KafkaException, RuntimeError) as exc:
                if self._closing.is_set():
                    return
                log.warning("control lease: poll failed (%s); trying again", exc)
                time.sleep(POLL_S)

    def _assigned(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        if any(p.topic == self.topic and p.partition == 0 for p in partitions):
            self.held_since = time.time()
            self._held.set()
            log.info("control lease: %s holds the lease (group %s)", self.name, self.group)

    def _revoked(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        if self._held.is_set() and any(p.topic == self.topic and p.partition == 0 for p in partitions):
            self._held.clear()
            if not self._closing.is_set():
                self._on_lost(f"the lease of group {self.group} was revoked from {self.name}")

    def _lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        if self._held.is_set():
            self._held.clear()
            if not self._closing.is_set():
                self._on_lost(f"{self.name} lost its session in group {self.group} (cut off from the brokers)")

    def wait_until_held(self, progress: Callable[[str], None], report_every_s: float = 30.0) -> float:
        """Block until this instance holds the lease; the seconds it waited."""
        started = last = time.monotonic()
        while not self._held.wait(1.0):
            if time.monotonic() - last >= report_every_s:
                last = time.monotonic()
                progress(f"standby for {last - started:.0f} s: another instance holds the control lease")
        return time.monotonic() - started

    def close(self) -> None:
        """Leave the group (a standby takes over at once when this one held the lease)."""
        self._closing.set()
        self._thread.join(POLL_S * 4)
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("control lease: close failed: %s", exc)


@dataclass(frozen=True)
class LeaseMember:
    client_id: str  # NAME@HOST:PID (``instance_id``)
    host: str
    active: bool


def lease_members(bootstrap: str, timeout_s: float = 10.0, group: str = CONTROL_LEASE_GROUP,
                  topic: str = CONTROL_LEASE) -> list[LeaseMember]:
    """Every instance in the lease group, the active one first; [] when none runs."""
    admin = AdminClient(with_cluster_config({"bootstrap.servers": bootstrap, "log_level": 4}))
    described = describe_group(admin, group, timeout_s)
    members = [LeaseMember(m.client_id, m.host.strip("/"), any(
        tp.topic == topic and tp.partition == 0 for tp in (m.assignment.topic_partitions if m.assignment else [])))
               for m in described.members]
    return sorted(members, key=lambda m: (not m.active, m.client_id))
