"""The one consume-process-produce loop every data-plane worker runs.

Life of a message through a worker:
1. ``poll``: the worker takes messages only while its handler has capacity (backpressure:
   what it cannot run stays in Kafka, visible as consumer lag, and other workers of the group
   can take it). The poll blocks for new messages unless the handler has work to run now: a
   handler that is only gathering (a micro-batch or a sink's insert batch not yet due) says
   when it will be due (``due_in``), and the poll waits until then at most, instead of
   spinning on empty polls.
2. ``decode``: bytes that are not a valid Avro record of the expected kind go to the
   ``deadletter`` topic with the reason; the worker goes on.
3. ``micro-batch``: the handler gathers items until its batch is full (count or token budget)
   or the first item has waited long enough, then ``step`` runs it (a prefill batch, or one
   decode step of the continuous batch that items join and leave at any step).
4. ``produce``: each finished item's outputs go out through an idempotent producer with
   ``acks=all``; the loop waits for every acknowledgement.
5. ``commit``: only then is the item's offset marked done; the committed position of a
   partition is its lowest unfinished offset. A worker killed at any moment loses nothing:
   uncommitted messages are consumed again by the group, and sinks drop duplicates by id.
On SIGTERM the worker stops taking work, finishes the work in flight (or hands it back after
``drain_timeout_s``), commits and closes. On a rebalance it commits what is done and hands
back the in-flight items of revoked partitions.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from phaseroute.consumers.handler import Completion, Handler, Output, WorkItem
from phaseroute.consumers.kafka_clients import TrackedProducer, new_consumer
from phaseroute.consumers.offsets import OffsetTracker
from phaseroute.infra.topics import DEADLETTER
from phaseroute.schemas import serde
from phaseroute.schemas.deadletter import Rejected, safe_decode, to_dead_letter

log = logging.getLogger(__name__)

# A commit refused because the group moved on: the member's generation is stale, it was
# removed, or a rebalance is under way. Not a failure of the work.
_REBALANCE_ERRORS = frozenset({
    KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS, KafkaError.UNKNOWN_MEMBER_ID,
})


class InvalidWorkError(Exception):
    """A decodable record that cannot be run; ``error_class`` names the engine's reason."""

    def __init__(self, error_class: str, reason: str) -> None:
        super().__init__(reason)
        self.error_class = error_class


@dataclass(frozen=True)
class LoopConfig:
    """How one worker consumes: its group, topics and the kinds it expects on them."""

    bootstrap: str
    group_id: str
    client_id: str
    topic_kinds: dict[str, str]  # topic -> expected Avro kind
    service: str  # named in dead-letter records, e.g. "decode-worker/int8"
    poll_timeout_s: float = 0.2
    max_poll: int = 64
    drain_timeout_s: float = 60.0
    consumer_overrides: dict[str, Any] = field(default_factory=dict)


def consumer_overrides(config: LoopConfig) -> dict[str, Any]:
    """The loop's consumer settings over the defaults. A worker on several topics (a colocated
    pool's: prefill and decode) splits each topic among the group (``range``): the default
    cooperative-sticky assignor balances the count of partitions over all topics, and gave one of
    two colocated workers every prefill partition and the other every decode partition, so the
    second never prefilled (``bench pipeline``, 2 workers: 48.5 against 0.8 CPU seconds). Range is
    an eager protocol: a member joining or leaving revokes every partition of the group once, and
    the in-flight work of those partitions is redone (not lost: offsets are committed first)."""
    overrides = dict(config.consumer_overrides)
    if len(config.topic_kinds) > 1:
        overrides.setdefault("partition.assignment.strategy", "range")
    return overrides


def _position(msg: Message) -> tuple[tuple[str, int], int]:
    """``((topic, partition), offset)`` of a consumed message without error (librdkafka sets all three)."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    if topic is None or partition is None or offset is None:
        raise ValueError(f"consumed message without a position: topic={topic!r} partition={partition!r} offset={offset!r}")
    return (topic, partition), offset


class WorkerLoop:
    """Runs a handler against Kafka until stopped."""

    def __init__(self, config: LoopConfig, handler: Handler, on_tick: Callable[[WorkerLoop], None] | None = None) -> None:
        self.config = config
        self.handler = handler
        self.producer = TrackedProducer(config.bootstrap, config.client_id)
        self.consumer = new_consumer(config.bootstrap, config.group_id, config.client_id, **consumer_overrides(config))
        self.offsets = OffsetTracker()
        self.assignment: set[tuple[str, int]] = set()
        self._stop = threading.Event()
        self._paused: set[tuple[str, int]] = set()  # partitions paused while the handler is full
        self._on_tick = on_tick
        self.stats = {"items": 0, "dead_letters": 0, "steps": 0, "commits": 0, "commits_refused": 0}

    # -- life cycle -------------------------------------------------------------------
    def stop(self, *_: object) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.stop)
        signal.signal(signal.SIGINT, self.stop)

    def run(self) -> None:
        self.consumer.subscribe(
            list(self.config.topic_kinds), on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        try:
            while not self._stop.is_set():
                self.run_once()
            self._drain()
        finally:
            self.consumer.close()

    def run_once(self) -> None:
        self._take_work()
        if self.handler.in_flight() and self.handler.batch_ready(time.time()):
            self._finish(self.handler.step())
            self.stats["steps"] += 1
        self._publish(self.handler.telemetry())
        self._commit()
        if self._on_tick is not None:
            self._on_tick(self)

    def _drain(self) -> None:
        deadline = time.monotonic() + self.config.drain_timeout_s
        while self.handler.in_flight() and time.monotonic() < deadline:
            self._finish(self.handler.step())
        self._publish(self.handler.telemetry())
        self._commit()  # unfinished work stays uncommitted: handed back to the group

    # -- poll and decode -------------------------------------------------------------
    def _take_work(self) -> None:
        room = self.handler.capacity()
        if room <= 0:
            # full: stop fetching but keep polling, so rebalances (a worker joining or leaving)
            # are served now rather than after max.poll.interval.ms
            self._set_paused(True)
            self.consumer.consume(1, 0)
            return
        self._set_paused(False)
        messages = self.consumer.consume(min(room, self.config.max_poll), self._poll_wait_s(time.time()))
        items, refused = [], []
        now = time.time()
        for msg in messages:
            error = msg.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("consume error: %s", error)
                continue
            tp, offset = _position(msg)
            self.offsets.taken(tp, offset)
            decoded = safe_decode(
                msg.value(), msg.key(), topic=tp[0], partition=tp[1], offset=offset,
                expected_kind=self.config.topic_kinds.get(tp[0]), service=self.config.service,
                now_ms=int(now * 1000),
            )
            if isinstance(decoded, Rejected):
                log.warning("dead letter from %s[%d]@%d: %s", tp[0], tp[1], offset, decoded.dead_letter["reason"])
                refused.append((tp, offset, decoded.dead_letter))
                continue
            items.append(WorkItem(tp, offset, decoded.kind, decoded.record, now, msg.timestamp()[1] / 1000.0))
        for tp, _offset, dead in refused:
            self.producer.produce(DEADLETTER, tp[0], serde.encode("dead_letter", dead))
        if refused:
            self.producer.flush_or_raise()
            for tp, offset, _ in refused:
                self.offsets.done(tp, offset)
            self.stats["dead_letters"] += len(refused)
        if items:
            self.stats["items"] += len(items)
            self._finish(self.handler.admit(items))

    def _poll_wait_s(self, now: float) -> float:
        """0 when there is work to run now; else until the handler's batch is due (or the poll timeout)."""
        if not self.handler.in_flight():
            return self.config.poll_timeout_s
        if self.handler.batch_ready(now):
            return 0.0
        return min(self.config.poll_timeout_s, max(0.0, self.handler.due_in(now)))

    # -- produce and commit ----------------------------------------------------------
    def _finish(self, completions: list[Completion]) -> None:
        if not completions:
            return
        for done in completions:
            if done.dead_letter_reason is not None:
                self.producer.produce(DEADLETTER, done.item.tp[0], self._dead_letter(done))
                self.stats["dead_letters"] += 1
            for out in done.outputs:
                self.producer.produce(out.topic, out.key, serde.encode(out.kind, out.record))
        self.producer.flush_or_raise()  # durable before any offset moves
        for done in completions:
            # a revoked partition was handed back; one assigned again (an eager rebalance gives
            # back the same partitions) may not hold this offset, or hold it from a new take
            # whose work this completion has just made durable
            if done.item.tp in self.assignment and self.offsets.holds(done.item.tp, done.item.offset):
                self.offsets.done(done.item.tp, done.item.offset)

    def _dead_letter(self, done: Completion) -> bytes:
        item = done.item
        log.warning("dead letter from %s[%d]@%d: %s", item.tp[0], item.tp[1], item.offset, done.dead_letter_reason)
        record = to_dead_letter(
            serde.encode(item.kind, item.record), None, item.tp[0], item.tp[1], item.offset,
            InvalidWorkError(done.error_class or "InvalidWork", done.dead_letter_reason or "invalid work"),
            "VALIDATE", self.config.service, int(time.time() * 1000), expected_kind=item.kind,
            error_class=done.error_class or "InvalidWork",
        )
        return serde.encode("dead_letter", record)

    def _publish(self, outputs: list[Output]) -> None:
        for out in outputs:
            self.producer.produce(out.topic, out.key, serde.encode(out.kind, out.record))

    def _commit(self) -> None:
        """Commit what is done. A group that is rebalancing (another worker joined or left)
        refuses the commit; the outputs are already durable, so the offsets stay pending here
        and go with the next commit if the partitions stay, or the new owner redoes that work
        (its results are deduplicated downstream): nothing is lost, the worker keeps running."""
        positions = {tp: pos for tp, pos in self.offsets.committable().items() if tp in self.assignment}
        if not positions:
            return
        try:
            self.consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in positions.items()],
                                 asynchronous=False)
        except KafkaException as exc:
            code = exc.args[0].code() if exc.args and isinstance(exc.args[0], KafkaError) else None
            if code not in _REBALANCE_ERRORS:
                raise
            log.warning("%s commit refused during a rebalance (%s); offsets stay pending",
                        self.config.client_id, exc.args[0].name())
            self.stats["commits_refused"] += 1
            return
        self.offsets.committed(positions)
        self.stats["commits"] += 1

    # -- rebalance ------------------------------------------------------------------
    def _set_paused(self, paused: bool) -> None:
        """Pause fetching from every assigned partition (newly assigned ones included), or resume."""
        if paused:
            todo = self.assignment - self._paused
            if todo:
                self.consumer.pause([TopicPartition(t, p) for t, p in todo])
                self._paused |= todo
        elif self._paused:
            held = self._paused & self.assignment
            if held:
                self.consumer.resume([TopicPartition(t, p) for t, p in held])
            self._paused = set()

    def _on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        log.info("%s assigned %s", self.config.client_id, sorted(f"{p.topic}[{p.partition}]" for p in partitions))
        self.assignment |= {(p.topic, p.partition) for p in partitions}

    def _on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        revoked = [(p.topic, p.partition) for p in partitions]
        log.info("%s revoked %s", self.config.client_id, sorted(f"{t}[{p}]" for t, p in revoked))
        self._commit()
        self.handler.drop(revoked)
        self.offsets.forget(revoked)
        self.assignment -= set(revoked)
        self._paused -= set(revoked)

    def _on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        lost = [(p.topic, p.partition) for p in partitions]
        self.handler.drop(lost)
        self.offsets.forget(lost)
        self.assignment -= set(lost)
        self._paused -= set(lost)

    # -- numbers for heartbeats ------------------------------------------------------
    def consumer_lag(self) -> int:
        """Messages in the assigned partitions not yet consumed (from the broker's watermarks: one
        round trip per partition, so the worker asks from its ``LagProbe`` thread)."""
        lag = 0
        assigned = [TopicPartition(t, p) for t, p in list(self.assignment)]  # a copy: callbacks change it
        if not assigned:
            return 0
        for pos in self.consumer.position(assigned):
            _low, high = self.consumer.get_watermark_offsets(TopicPartition(pos.topic, pos.partition), timeout=2)
            committed_or_pos = pos.offset if pos.offset >= 0 else 0
            lag += max(0, high - committed_or_pos)
        return lag
