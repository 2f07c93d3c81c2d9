"""The job trackers' Kafka loop: verdicts, receipts and cancels in, job events out.

Every ``phaseroute control`` instance, active or standby, runs one on a background thread around
its own ``JobTracker`` (``streams/core/tracker.py``); the instances form the consumer group
``phaseroute-tracking`` on ``jobs.admissions``, ``results.written`` and ``jobs.commands``, which
are co-partitioned by job id, so each instance tracks the jobs of the partitions it owns. Life
of a job through it:
1. the group gives this instance partition p of the three topics at once (the range assignor,
   see ``_consumer``); before any record of p is handled, the jobs of p are read back from the
   compacted changelog ``phaseroute-tracking-changelog`` (partition p: one record per job, its
   ``JobRecord`` as JSON), inside the assignment callback;
2. the job's verdict (``jobs.admissions``) is taken; a receipt of the result sink
   (``results.written``) sets the job's counters from its output's exact tallies: RUNNING,
   PROGRESS, then COMPLETED (FAILED when nothing succeeded) once every request has its line;
3. a cancel from the tenant that owns the job (``jobs.commands``) makes it CANCELLED; every
   second the tracker's clock expires the jobs left unfinished past their deadline's grace;
4. each change is the job's event on ``jobs.events`` and ``jobs.state`` (where the dispatcher
   reads the final ones); a batch of records read ends in one Kafka transaction
   (``consumers/kafka_transactions.py``): its events, its changed jobs' records on the changelog
   and its input offsets land together or not at all. An instance killed on the way leaves its
   next owner to read the batch again (replayed verdicts, receipts and cancels change nothing in
   a restored job, and each event is made again with the same event id). An instance that lost
   its partitions without knowing it (paused past the session timeout: a zombie) has its
   transaction refused by the group coordinator, so its late records never reach the changelog
   after the new owner's; it rewinds to what was committed and hears of the move next;
5. when p is revoked the offsets handled are committed and the jobs of p released (lost, as
   after a session timeout: released only; another instance owns p by then).
A receipt or cancel read before its job's verdict waits in the tracker, and holds back its
partition's commit until the verdict comes (``tracking_offsets.py``). An undecodable record, or
one whose handling raised, goes to ``deadletter`` with the reason and the loop goes on.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from phaseroute.consumers.kafka_clients import new_consumer
from phaseroute.consumers.kafka_transactions import BatchOutcome, Outgoing, TransactionalProducer
from phaseroute.infra import topics
from phaseroute.infra.blobstore import output_prefix
from phaseroute.infra.kafka_offsets import end_offsets
from phaseroute.schemas.deadletter import Rejected, safe_decode, to_dead_letter
from phaseroute.schemas.enums import DeadLetterStage
from phaseroute.schemas.serde import encode
from phaseroute.streams import edge
from phaseroute.streams.admission_edge import job_admitted
from phaseroute.streams.core import CancelRequested, Decision, JobChanged, JobTracker, OutputWritten, Problem
from phaseroute.streams.core.tracker import TrackerEvent
from phaseroute.streams.edge import Send
from phaseroute.streams.tracking_offsets import CommitPositions

log = logging.getLogger(__name__)
SERVICE = "control/tracking"
BATCH = 500
TICK_EVERY_S = 1.0
RETRY_S = 1.0


@dataclass(frozen=True)
class TrackingTopics:
    """The topics the loop reads and the changelog it keeps (tests give their own)."""

    admissions: str = topics.JOBS_ADMISSIONS
    written: str = topics.RESULTS_WRITTEN
    commands: str = topics.JOBS_COMMANDS
    changelog: str = topics.TRACKING_CHANGELOG

    def inputs(self) -> dict[str, tuple[str, Callable[[dict[str, Any]], TrackerEvent | None]]]:
        """Input topic -> (its Avro kind, the converter to the tracker's event; None: not for it)."""
        return {self.admissions: ("job_admission", job_admitted), self.written: ("output_written", edge.output_written),
                self.commands: ("job_command", edge.cancel)}


class TrackingLoop:
    def __init__(self, bootstrap: str, tracker: JobTracker, client_id: str, session_timeout_s: float, *,
                 output_file: Callable[[str, str], str] = output_prefix, names: TrackingTopics = TrackingTopics(),
                 group: str = topics.TRACKING_GROUP, max_poll_interval_s: float = 600.0) -> None:
        """``max_poll_interval_s``: a batch (or restore) taking longer puts the instance out of the group."""
        self.bootstrap, self.tracker, self.client_id, self.group = bootstrap, tracker, client_id, group
        self.output_file, self.names, self._inputs = output_file, names, names.inputs()
        self.consumer = self._consumer(session_timeout_s, max_poll_interval_s)
        self.producer = TransactionalProducer(bootstrap, f"{client_id}/tracking", session_timeout_s)
        self._positions = CommitPositions()
        self._assigned: frozenset[tuple[str, int]] = frozenset()  # (topic, partition) handled here now
        self._owned: frozenset[int] = frozenset()  # their partition numbers, restored from the changelog
        self._counts = {"handled": 0, "dead_lettered": 0, "restored": 0, "rebalances": 0, "rewinds": 0}
        self._ticked = 0.0
        self._undelivered = False  # a batch's sends were given up on (stopping): commit nothing more
        self._rewind_due = False  # a batch was aborted: the partitions held go back to their commit first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-tracking", daemon=True)

    def _consumer(self, session_timeout_s: float, max_poll_interval_s: float) -> Consumer:
        session_ms = int(session_timeout_s * 1000)
        # The range assignor, not phaseroute's usual cooperative-sticky: range deals out each topic's
        # partitions over the same sorted member list, so with equal partition counts a member gets
        # the same partition numbers of all three inputs, and a job's verdict, receipts and cancels
        # reach the one tracker holding it. Sticky assignors balance partitions over all topics
        # together and align no numbers. Range is eager: a rebalance revokes every partition and
        # each is restored again from its changelog (compacted: one record per job).
        return new_consumer(self.bootstrap, self.group, self.client_id, **{
            "partition.assignment.strategy": "range", "session.timeout.ms": session_ms,
            "heartbeat.interval.ms": max(500, session_ms // 5), "max.poll.interval.ms": int(max_poll_interval_s * 1000)})

    def start(self) -> None:
        self.consumer.subscribe(list(self._inputs), on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the batch in hand; the consumer's close revokes (and commits) its partitions."""
        self._stop.set()
        self._thread.join(timeout=60)

    def owned_partitions(self) -> list[int]:
        return sorted(self._owned)

    def status(self) -> dict[str, Any]:
        return {"client_id": self.client_id, "group": self.group, "partitions": self.owned_partitions(),
                "jobs": len(self.tracker.jobs), **self._counts,
                **{f"transactions_{k}": n for k, n in self.producer.counts.items()}}

    # -- the loop ----------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    messages = self.consumer.consume(num_messages=BATCH, timeout=0.2)
                except KafkaException:
                    log.exception("tracking: consume failed; trying again")
                    self._stop.wait(RETRY_S)
                    continue
                if self._stop.is_set():  # a restore may have been cut short: handle nothing more
                    break
                if self._rewind_due:  # these were fetched before the rewind: read again from the commit
                    self._rewind()
                    continue
                group = self.consumer.consumer_group_metadata()  # the generation these records were read in
                now = time.time()
                sends = [send for msg in messages for send in self._handle(msg, now)]
                if now - self._ticked >= TICK_EVERY_S:
                    self._ticked = now
                    sends += self._sends_of(self.tracker.tick(now), now, None)
                outcome = self._transact(sends, group)
                if outcome is BatchOutcome.STOPPED:
                    self._undelivered = True
                    break
                if outcome is BatchOutcome.ABORTED:
                    self._forget_batch()
                    self._rewind()
        finally:
            self.consumer.close()
            log.info("tracking: stopped (%s)", self.status())

    def _handle(self, msg: Message, now: float) -> list[Send]:
        """One record read: the sends it makes (its job's events, or its dead letter)."""
        error = msg.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("tracking: %s", error)
            return []
        topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
        if (topic, partition) not in self._assigned:  # fetched before its partition left: its next owner reads it
            return []
        self._positions.handled(topic, partition, offset)
        self._counts["handled"] += 1
        kind, to_event = self._inputs[topic]
        decoded = safe_decode(msg.value(), msg.key(), topic=topic, partition=partition, offset=offset, service=SERVICE,
                              now_ms=edge.ms(now), expected_kind=kind)
        if isinstance(decoded, Rejected):
            return [self._dead_letter(topic, decoded.dead_letter)]
        try:
            event = to_event(decoded.record)
            if event is None:
                return []
            decisions = self.tracker.handle(event, now)
            waiting = self._waiting_for_verdict(event)
            if waiting is not None:
                self._positions.waiting(topic, partition, offset, waiting, now)
            return self._sends_of(decisions, now, msg)
        except Exception as exc:  # one bad record must not stop the tracking
            log.exception("tracking: %s@%d of partition %d not handled", topic, offset, partition)
            return [self._dead_letter(topic, to_dead_letter(msg.value(), msg.key(), topic, partition, offset, exc,
                                                            DeadLetterStage.PROCESS, SERVICE, edge.ms(now)))]

    def _waiting_for_verdict(self, event: TrackerEvent) -> str | None:
        """The job whose verdict the tracker keeps ``event`` for, if it does (as ``JobTracker._waits``;
        a canary's cancel is dropped at once)."""
        if isinstance(event, CancelRequested) and event.tenant == self.tracker.config.canary_tenant:
            return None
        if isinstance(event, (OutputWritten, CancelRequested)) and event.job_id not in self.tracker.jobs:
            return event.job_id
        return None

    def _sends_of(self, decisions: list[Decision], now: float, origin: Message | None) -> list[Send]:
        out: list[Send] = []
        for d in decisions:
            if isinstance(d, JobChanged):
                out += edge.job_changed_sends(d, now, self.output_file)
            elif isinstance(d, Problem):
                out.append(self._problem(d, now, origin))
            else:
                log.error("tracking: the tracker decided %r, which this loop does not carry out", d)
        return out

    def _problem(self, p: Problem, now: float, origin: Message | None) -> Send:
        """Log the problem and dead-letter the record that caused it (the tick's: none) with the reason."""
        log.error("job tracker could not handle %s: %s", p.where, p.reason)
        error = RuntimeError(f"{p.where}: {p.reason}")
        if origin is None:
            source = f"{SERVICE}/{p.where}"
            return self._dead_letter(source, to_dead_letter(None, None, source, None, None, error,
                                                            DeadLetterStage.PROCESS, SERVICE, edge.ms(now)))
        source = origin.topic() or ""
        return self._dead_letter(source, to_dead_letter(origin.value(), origin.key(), source, origin.partition(),
                                                        origin.offset(), error, DeadLetterStage.PROCESS, SERVICE,
                                                        edge.ms(now)))

    def _dead_letter(self, source_topic: str, letter: dict[str, Any]) -> Send:
        self._counts["dead_lettered"] += 1
        return Send(topics.DEADLETTER, source_topic, "dead_letter", letter)

    def _transact(self, sends: list[Send], group: Any) -> BatchOutcome:
        """The batch's sends, its changed jobs' records on the changelog and the input offsets now
        due, in one transaction (``group``: the consumer group metadata of the batch's generation)."""
        if self._undelivered:
            return BatchOutcome.STOPPED
        self._positions.settle(lambda job_id: job_id in self.tracker.jobs, time.time(),
                               self.tracker.config.early_event_ttl_s)
        offsets = self._positions.due()
        records = [Outgoing(s.topic, s.key, encode(s.kind, s.record), s.partition) for s in sends]
        records += [Outgoing(self.names.changelog, job_id, None if record is None else json.dumps(record).encode(),
                             topics.partition_of(job_id))  # None: a dropped job's tombstone
                    for job_id, record in self.tracker.changed_records().items()]
        outcome = self.producer.commit_batch(records, offsets, group, self._stop)
        if outcome is BatchOutcome.COMMITTED:
            self._positions.committed(offsets)
        return outcome

    def _forget_batch(self) -> None:
        """The batch's transaction was aborted: none of its events, job records or offsets happened.
        Forget what it changed at once (the jobs of the partitions held, the positions handled), so
        that nothing of it is committed by a revocation before the rewind is done."""
        numbers = set(self._owned)
        jobs = [job_id for job_id in list(self.tracker.jobs) if topics.partition_of(job_id) in numbers]
        self.tracker.release(jobs + sorted(self._positions.waiting_jobs(numbers)))
        self._positions.forget([TopicPartition(topic, p) for topic, p in self._assigned])
        self._counts["rewinds"] += 1
        self._rewind_due = True

    def _rewind(self) -> None:
        """Back to where the last committed batch left the partitions held: their jobs read back
        from the changelog, their inputs fetched again from the committed offsets. Tried again
        before each later batch until it succeeds (a zombie hears meanwhile that its partitions moved)."""
        held = [TopicPartition(topic, p) for topic, p in sorted(self._assigned)]
        if not held:  # they all left meanwhile: their next owners read them from the commit
            self._rewind_due = False
            return
        try:
            self._restore(set(self._owned))
            for tp in self.consumer.committed(held, timeout=30):
                start = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
                self.consumer.seek(TopicPartition(tp.topic, tp.partition, start))
            self._rewind_due = False
        except Exception:
            log.exception("tracking: partitions %s not rewound yet; trying again", sorted(self._owned))
            self._stop.wait(RETRY_S)

    # -- partitions come and go (callbacks, on the polling thread, inside consume) -------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Restore the new partitions' jobs before the callback returns: the consumer fetches none of
        their records until then, and the loop is single-threaded, so no record of a partition is
        handled before its jobs are back. With the eager range assignor every partition is (re)assigned
        at once, so blocking here holds nothing else up; the background heartbeat keeps the membership."""
        self._counts["rebalances"] += 1
        numbers = {tp.partition for tp in partitions}
        for topic in self._inputs:
            got = {tp.partition for tp in partitions if tp.topic == topic}
            if got != numbers:
                log.error("tracking: given partitions %s of %s but %s of the inputs together: are the inputs "
                          "co-partitioned (same partition count) and is every member on the range assignor?",
                          sorted(got), topic, sorted(numbers))
        new = numbers - self._owned
        while new and not self._stop.is_set():
            try:
                self._restore(new)
                break
            except Exception:  # no record of them may be handled before they are back: ask again
                log.exception("tracking: changelog partitions %s not read back; trying again", sorted(new))
                self._stop.wait(RETRY_S)
        self._assigned = frozenset((tp.topic, tp.partition) for tp in partitions)
        self._owned = frozenset(numbers)
        self._rewind_due = False  # every partition was revoked first (eager): all of them were read back
        log.info("tracking: %s owns partitions %s (%d jobs tracked)", self.client_id, sorted(numbers),
                 len(self.tracker.jobs))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Commit what is due (offsets a verdict released since the last batch) while this generation
        still owns the partitions, then let them go."""
        self._transact([], consumer.consumer_group_metadata())
        self._leave(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.warning("tracking: partitions %s lost (another instance owns them by now)",
                    sorted({tp.partition for tp in partitions}))
        self._leave(partitions)

    def _leave(self, partitions: list[TopicPartition]) -> None:
        numbers = {tp.partition for tp in partitions}
        jobs = [job_id for job_id in list(self.tracker.jobs) if topics.partition_of(job_id) in numbers]
        self.tracker.release(jobs + sorted(self._positions.waiting_jobs(numbers)))
        self._positions.forget(partitions)
        left = {(tp.topic, tp.partition) for tp in partitions}
        self._assigned = frozenset(self._assigned - left)
        self._owned = frozenset(p for _, p in self._assigned)

    def _restore(self, partitions: set[int]) -> None:
        """Read changelog partitions from the beginning to their end now, each record to the tracker
        (later records win; a tombstone releases its job)."""
        reader = new_consumer(self.bootstrap, f"tracking-restore-{uuid.uuid4().hex}", f"{self.client_id}/restore",
                              **{"enable.partition.eof": True})
        try:
            wanted = [TopicPartition(self.names.changelog, p, OFFSET_BEGINNING) for p in sorted(partitions)]
            ends = end_offsets(reader, wanted)
            reader.assign(wanted)
            left = {p for p, end in ends.items() if end > 0}
            restored = 0
            while left and not self._stop.is_set():
                msg = reader.poll(1.0)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        raise KafkaException(error)
                    left.discard(msg.partition() or 0)  # the end (compaction can leave gaps before it)
                    continue
                partition, offset = msg.partition() or 0, msg.offset() or 0
                if offset + 1 >= ends[partition]:
                    left.discard(partition)
                restored += self._restore_one(msg)
        finally:
            reader.close()
        self._counts["restored"] += restored
        log.info("tracking: %d job records read back from %s partitions %s", restored, self.names.changelog,
                 sorted(partitions))

    def _restore_one(self, msg: Message) -> int:
        key, value = msg.key(), msg.value()
        try:
            if value is None:
                self.tracker.release([key.decode() if isinstance(key, bytes) else str(key)])
                return 0
            self.tracker.restore(json.loads(value))
            return 1
        except Exception:  # a record this loop wrote should restore; one that does not is skipped, named
            log.exception("tracking: changelog record %s[%s]@%s (key %r) not restored", msg.topic(), msg.partition(),
                          msg.offset(), key)
            return 0
