"""The admission desk's Kafka loop: ``jobs.submitted`` in, verdicts and requests out.

Every ``phaseroute control`` instance, active or standby, runs one on a background thread; the
instances form the consumer group ``phaseroute-admission`` on ``jobs.submitted`` (keyed by job
id), so each judges the jobs of the partitions it owns and an operator scales admission by
starting instances. Life of a submission through it:
1. a partition it is given is first read back from ``jobs.admissions`` (co-partitioned with
   ``jobs.submitted``): the verdicts reached there before, by this desk or another;
2. the submission is decoded (an undecodable one goes to ``deadletter`` with the reason);
3. the desk waits until the dispatcher's load snapshot (``control.load``) is younger than
   ``max_load_age_s``: while no dispatcher is active (a fail-over) submissions wait in Kafka;
4. intake and the verdict (``AdmissionDesk``); the verdict's sends (``jobs.admissions``, the
   job's event) are flushed before the requests go to ``requests.pending``, so a request on that
   topic always has a durable verdict;
5. the offset is committed once every send is acknowledged. A desk killed before that leaves
   the submission to the partition's next owner, which knows the verdict and queues the
   requests again under the same ids (the tracker drops the ones it has).
A submission whose handling raised goes to ``deadletter`` with the reason and the desk goes on.
The partitions a desk owns are worked on side by side, one submission of each at a time (a
thread each; the partition is paused meanwhile), so a small job is not queued behind the
intake of a 50,000-line file on another partition; the verdicts themselves are reached one at a
time (the desk's backlog counts each admission before the next verdict).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from phaseroute.consumers.kafka_clients import DeliveryError, TrackedProducer, new_consumer
from phaseroute.infra import topics
from phaseroute.infra.kafka_offsets import end_offsets
from phaseroute.infra.topic_follower import TopicFollower
from phaseroute.schemas.deadletter import Rejected, safe_decode, to_dead_letter
from phaseroute.schemas.enums import DeadLetterStage
from phaseroute.schemas.serde import encode
from phaseroute.streams.admission_desk import AdmissionDesk
from phaseroute.streams.edge import Send

log = logging.getLogger(__name__)
SERVICE = "control/admission"
CATCH_UP_S = 15.0  # how long a start waits for the pool and profile views before it judges anyway
MAX_LOAD_AGE_S = 15.0  # a desk judges only against a dispatcher load snapshot younger than this


class Admitter:
    def __init__(self, bootstrap: str, desk: AdmissionDesk, client_id: str, session_timeout_s: float,
                 max_load_age_s: float = MAX_LOAD_AGE_S) -> None:
        self.bootstrap, self.desk, self.max_load_age_s = bootstrap, desk, max_load_age_s
        session_ms = int(session_timeout_s * 1000)
        self.consumer = new_consumer(bootstrap, topics.ADMISSION_GROUP, client_id, **{
            "session.timeout.ms": session_ms, "heartbeat.interval.ms": max(500, session_ms // 5)})
        self.producer = TrackedProducer(bootstrap, f"{client_id}/admission")
        self.followers = [
            TopicFollower(bootstrap, topics.POOLS_HEARTBEAT, "pool_heartbeat", desk.pools.on_record, service=SERVICE),
            TopicFollower(bootstrap, topics.PROFILES, "profile_row", desk.profiles.on_record, service=SERVICE),
            TopicFollower(bootstrap, topics.CONTROL_LOAD, "load_snapshot", desk.on_load, service=SERVICE),
        ]
        self._learned: set[int] = set()  # partitions of jobs.submitted whose verdicts were read back
        self._busy: dict[int, Future[Outcome]] = {}  # partition -> its submission being handled
        self._skipped: dict[int, int] = {}  # partition -> first offset fetched while it was busy
        self._pool = ThreadPoolExecutor(max_workers=topics.CONTROL_PARTITIONS, thread_name_prefix="admission")
        self._judging = threading.Lock()  # one verdict at a time: each counts the admissions before it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="admission-desk", daemon=True)

    def start(self) -> None:
        for follower in self.followers:
            follower.start()
        self.consumer.subscribe([topics.JOBS_SUBMITTED], on_revoke=self._revoked, on_lost=self._revoked)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for follower in self.followers:
            follower.stop()

    def _revoked(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """A partition leaves: its submission in hand is finished (and committed) first, so its next
        owner starts after it; its verdicts are read again should it come back."""
        for tp in partitions:
            self._skipped.pop(tp.partition, None)
            busy = self._busy.pop(tp.partition, None)
            if busy is not None:
                try:
                    self._commit(busy.result(timeout=120))
                except TimeoutError:  # still at work: the partition's next owner reads it again
                    log.error("admission desk: partition %d left while its submission was still handled", tp.partition)
            self._learned.discard(tp.partition)

    # -- the loop ----------------------------------------------------------------------------------
    def _run(self) -> None:
        waited = 0.0
        while waited < CATCH_UP_S and not all(f.caught_up.is_set() for f in self.followers[:2]):
            time.sleep(0.1)
            waited += 0.1
        try:
            while not self._stop.is_set():
                self._resume_finished()
                msg = self.consumer.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    log.warning("admission desk: %s", msg.error())
                    continue
                partition = msg.partition() or 0
                tp = TopicPartition(topics.JOBS_SUBMITTED, partition, msg.offset() or 0)
                if partition in self._busy:  # fetched before its partition was paused: read it again later
                    self._skipped.setdefault(partition, tp.offset)
                    continue
                self.consumer.pause([tp])
                self._busy[partition] = self._pool.submit(self._handle_safely, msg)
        finally:
            self._pool.shutdown(wait=True)
            self.consumer.close()

    def _resume_finished(self) -> None:
        """Partitions whose submission is handled go on: its offset is committed (here: the
        consumer commits from the thread that polls it), or it is read again when it must be;
        records fetched while the partition was busy are read again (a partition whose seek
        fails stays paused and is tried again next time round)."""
        done = [p for p, f in self._busy.items() if f.done()]
        for p in done:
            outcome = self._busy.pop(p).result()
            self._commit(outcome)
            offsets = [o for o in (outcome.again, self._skipped.pop(p, None)) if o is not None]
            if offsets:
                try:
                    self.consumer.seek(TopicPartition(topics.JOBS_SUBMITTED, p, min(offsets)))
                except KafkaException:
                    log.exception("admission desk: could not go back to %d of partition %d", min(offsets), p)
                    self._skipped[p] = min(offsets)
                    self._busy[p] = _handled()
                    continue
            self.consumer.resume([TopicPartition(topics.JOBS_SUBMITTED, p)])

    def _commit(self, outcome: Outcome) -> None:
        if outcome.commit is None:
            return
        try:
            self.consumer.commit(message=outcome.commit, asynchronous=False)
        except KafkaException:  # its verdict is durable: whoever reads it again requeues under the same ids
            log.exception("admission desk: %s@%s not committed", outcome.commit.topic(), outcome.commit.offset())

    def _handle_safely(self, msg: Message) -> Outcome:
        try:
            return self._handle(msg)
        except Exception:  # a dead letter could not be sent: read it again
            log.exception("admission desk: %s@%s not handled; reading it again", msg.topic(), msg.offset())
            time.sleep(1.0)
            return Outcome(again=msg.offset())

    def _handle(self, msg: Message) -> Outcome:
        """Handle one submission (on a worker thread): what the polling thread does next."""
        partition, offset = msg.partition() or 0, msg.offset() or 0
        if partition not in self._learned:
            try:
                self._learn(partition)
            except KafkaException:
                log.exception("admission desk: could not read back partition %d of %s; trying again",
                              partition, topics.JOBS_ADMISSIONS)
                time.sleep(1.0)
                return Outcome(again=offset)
        decoded = safe_decode(msg.value(), msg.key(), topic=topics.JOBS_SUBMITTED, partition=partition, offset=offset,
                              service=SERVICE, now_ms=_now_ms(), expected_kind="job_submitted")
        try:
            if isinstance(decoded, Rejected):
                self._send([Send(topics.DEADLETTER, topics.JOBS_SUBMITTED, "dead_letter", decoded.dead_letter)])
            else:
                self._wait_for_load()
                self._admit(decoded.record)
        except DeliveryError:
            log.exception("admission desk: sends of %s@%d not acknowledged; reading it again", msg.key(), offset)
            time.sleep(1.0)
            return Outcome(again=offset)
        except Exception as exc:  # one bad submission must not stop the desk
            log.exception("admission desk failed on %s", msg.key())
            letter = to_dead_letter(msg.value(), msg.key(), topics.JOBS_SUBMITTED, partition, offset, exc,
                                    DeadLetterStage.PROCESS, SERVICE, _now_ms())
            self._send([Send(topics.DEADLETTER, topics.JOBS_SUBMITTED, "dead_letter", letter)])
        return Outcome(commit=msg)

    def _admit(self, record: dict[str, Any]) -> None:
        started = time.monotonic()
        scan = self.desk.intake(record)  # the slow part, side by side with other partitions
        with self._judging:
            verdict, requests = self.desk.submitted(record, scan, time.time())
        self._send(verdict)  # durable before any request of the job
        n = 0
        for send in requests:
            self.producer.produce(send.topic, send.key, encode(send.kind, send.record, validate=False))
            n += 1
        self.producer.flush_or_raise()
        log.info("admission desk: job %s judged (%s), %d requests queued in %.1f s", record["job_id"],
                 self.desk.known[record["job_id"]].state.name, n, time.monotonic() - started)

    def _send(self, sends: list[Send]) -> None:
        for send in sends:
            self.producer.produce(send.topic, send.key, encode(send.kind, send.record))
        self.producer.flush_or_raise()

    def _wait_for_load(self) -> None:
        said = False
        while not self._stop.is_set():
            age = self.desk.load_age(time.time())
            if age is not None and age <= self.max_load_age_s:
                return
            if not said:
                log.info("admission desk: waiting for a dispatcher load snapshot younger than %.0f s (last: %s)",
                         self.max_load_age_s, "none" if age is None else f"{age:.0f} s old")
                said = True
            time.sleep(0.2)

    def _learn(self, partition: int) -> None:
        """Read the partition's verdicts from ``jobs.admissions`` (same partition number: the two
        topics are co-partitioned by job id) up to its end now."""
        reader = new_consumer(self.bootstrap, f"admission-learn-{uuid.uuid4().hex}", "admission-learn",
                              **{"enable.partition.eof": True})
        try:
            tp = TopicPartition(topics.JOBS_ADMISSIONS, partition, OFFSET_BEGINNING)
            end = end_offsets(reader, [tp])[partition]
            reader.assign([tp])
            position = 0
            while position < end:
                msg = reader.poll(1.0)
                if msg is None:
                    continue
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        break  # the end (compaction or control records can leave gaps before it)
                    raise KafkaException(error)
                position = (msg.offset() or 0) + 1
                decoded = safe_decode(msg.value(), msg.key(), topic=topics.JOBS_ADMISSIONS, partition=partition,
                                      offset=msg.offset(), service=SERVICE, now_ms=_now_ms(),
                                      expected_kind="job_admission")
                if not isinstance(decoded, Rejected):
                    self.desk.learn(decoded.record)
        finally:
            reader.close()
        self._learned.add(partition)
        log.info("admission desk: owns partition %d of %s (%d verdicts known)", partition, topics.JOBS_SUBMITTED,
                 len(self.desk.known))


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one submission: ``commit`` its message, or read it again from ``again``."""

    commit: Message | None = None
    again: int | None = None


def _handled() -> Future[Outcome]:
    done: Future[Outcome] = Future()
    done.set_result(Outcome())
    return done


def _now_ms() -> int:
    return int(time.time() * 1000)
