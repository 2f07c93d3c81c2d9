"""Job tracking partitioned across control-plane instances, live on the real broker: two
``TrackingLoop`` instances in one consumer group (this process, two client ids) on test copies
of ``jobs.admissions``, ``results.written``, ``jobs.commands`` and the tracking changelog (4
partitions each); their job events go to the real ``jobs.events`` / ``jobs.state``, read back
from where they ended when the test began.

(a) the range assignor gives each instance the same partition numbers of the three inputs; a
    job's receipts covering every request complete it: one COMPLETED event, its counters on
    ``jobs.state``;
(b) one instance leaves mid-way: the other is given its partitions, reads their jobs back from
    the changelog (RUNNING, counters intact) and completes them on later receipts, without a
    second RUNNING event;
(c) a cancel from the tenant that owns the job cancels it; from another tenant, or a second
    time, nothing; an undecodable record is dead-lettered and the loop goes on;
(d) an instance paused mid-batch past its poll interval (a zombie) has its late transaction
    refused: its stale job record never lands on the changelog after its successor's.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from phaseroute.consumers.kafka_clients import TrackedProducer
from phaseroute.infra import topics
from phaseroute.infra.blobstore import output_prefix
from phaseroute.infra.group_admin import describe_group
from phaseroute.infra.kafka_offsets import end_offsets
from phaseroute.schemas.enums import JobState, QualityTier
from phaseroute.schemas.serde import decode, encode
from phaseroute.streams.admission_edge import admission_send
from phaseroute.streams.core import CoreConfig, Decision, JobRecord, JobTracker, OutputWritten
from phaseroute.streams.core.tracker import TrackerEvent
from phaseroute.streams.tracking_loop import TrackingLoop, TrackingTopics

pytestmark = pytest.mark.kafka
TENANT = "trk"
REQUESTS = 3
SESSION_S = 6.0  # the broker's group.min.session.timeout.ms


class EventReader:
    """The job events of ``jobs`` on a real topic, from its end when the reader was made."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex}",
                                  "enable.auto.commit": False, "fetch.wait.max.ms": 50})
        parts = [TopicPartition(topic, p) for p in range(topics.CONTROL_PARTITIONS)]
        ends = end_offsets(self.consumer, parts)
        self.consumer.assign([TopicPartition(topic, p, ends[p]) for p in ends])
        self.events: list[dict[str, Any]] = []

    def wait(self, jobs: set[str], done: Callable[[list[dict[str, Any]]], bool], what: str, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not done(self.events):
            assert time.monotonic() < deadline, f"not seen in {timeout_s:.0f} s: {what}; events: {self.summary()}"
            self.read(jobs, 0.2)

    def read(self, jobs: set[str], for_s: float) -> None:
        until = time.monotonic() + for_s
        while time.monotonic() < until:
            msg = self.consumer.poll(0.1)
            if msg is not None and not msg.error():
                record = decode(msg.value() or b"", "job_event")[1]
                if record["job_id"] in jobs:
                    self.events.append(record)

    def kinds(self, job_id: str) -> Counter[str]:
        return Counter(e["kind"] for e in self.events if e["job_id"] == job_id)

    def latest(self, job_id: str) -> dict[str, Any]:
        return [e for e in self.events if e["job_id"] == job_id][-1]

    def summary(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for e in self.events:
            out.setdefault(e["job_id"], []).append(e["kind"])
        return out


@pytest.fixture()
def names(make_topic: Callable[..., str]) -> TrackingTopics:
    return TrackingTopics(admissions=make_topic("admissions", topics.CONTROL_PARTITIONS),
                          written=make_topic("written", topics.CONTROL_PARTITIONS),
                          commands=make_topic("commands", topics.CONTROL_PARTITIONS),
                          changelog=make_topic("changelog", topics.CONTROL_PARTITIONS, {"cleanup.policy": "compact"}))


@pytest.fixture()
def loops(bootstrap: str, names: TrackingTopics) -> Iterator[dict[str, TrackingLoop]]:
    group = f"test-tracking-{uuid.uuid4().hex[:8]}"
    made = {name: TrackingLoop(bootstrap, JobTracker(CoreConfig()), name, SESSION_S, names=names, group=group)
            for name in ("tracker-a", "tracker-b")}
    for loop in made.values():
        loop.start()
    yield made
    for loop in made.values():
        loop.stop()


def _job_ids(per_partition: int) -> dict[int, list[str]]:
    """Partition -> job ids landing there (murmur2 of the key), ``per_partition`` of each."""
    out: dict[int, list[str]] = {p: [] for p in range(topics.CONTROL_PARTITIONS)}
    run = uuid.uuid4().hex[:8]
    n = 0
    while any(len(ids) < per_partition for ids in out.values()):
        job_id = f"trk-{run}-{n}"
        n += 1
        ids = out[topics.partition_of(job_id)]
        if len(ids) < per_partition:
            ids.append(job_id)
    return out


def _verdict(job_id: str) -> tuple[str, str, bytes]:
    now = time.time()
    job = JobRecord(job_id, TENANT, "smollm2", 1, now, now + 3600, QualityTier.EXACT, JobState.ADMITTED,
                    requests_total=REQUESTS, prefill_left=30, decode_left=12)
    send = admission_send(job, "test-desk", now)
    return job_id, send.kind, encode(send.kind, send.record)


def _receipt(job_id: str, lines: int, ok: int, failed: int) -> tuple[str, str, bytes]:
    record = {"job_id": job_id, "lines": lines, "ok": ok, "failed": failed, "tokens_in": 10 * lines,
              "tokens_out": 4 * ok, "path": output_prefix(TENANT, job_id), "writer": "test-sink",
              "at": int(time.time() * 1000)}
    return job_id, "output_written", encode("output_written", record)


def _cancel(job_id: str, tenant: str) -> tuple[str, str, bytes]:
    record = {"job_id": job_id, "tenant": tenant, "command": "CANCEL", "at": int(time.time() * 1000),
              "reason": f"cancelled by {tenant}"}
    return job_id, "job_command", encode("job_command", record)


def _publish(producer: TrackedProducer, topic: str, messages: list[tuple[str, str, bytes]]) -> None:
    for key, _, value in messages:
        producer.produce(topic, key, value)
    producer.flush_or_raise()


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not so after {timeout_s:.0f} s: {what}"
        time.sleep(0.1)


def _group_assignment(bootstrap: str, group: str) -> dict[str, dict[str, set[int]]]:
    """Client id -> topic -> partitions, as the broker's group coordinator has it."""
    members = describe_group(AdminClient({"bootstrap.servers": bootstrap}), group, 10).members
    out: dict[str, dict[str, set[int]]] = {}
    for m in members:
        for tp in m.assignment.topic_partitions:
            out.setdefault(m.client_id, {}).setdefault(tp.topic, set()).add(tp.partition)
    return out


def test_tracking_is_partitioned_restored_on_a_move_and_obeys_cancels(
        bootstrap: str, names: TrackingTopics, loops: dict[str, TrackingLoop]) -> None:
    a, b = loops["tracker-a"], loops["tracker-b"]
    events = EventReader(bootstrap, topics.JOBS_EVENTS)
    states = EventReader(bootstrap, topics.JOBS_STATE)
    producer = TrackedProducer(bootstrap, "test-tracking")

    # (a) the group splits the partitions; each member has the same numbers of the three inputs
    _wait(lambda: len(a.owned_partitions()) == len(b.owned_partitions()) == 2, "each instance owns 2 partitions")
    assert sorted(a.owned_partitions() + b.owned_partitions()) == [0, 1, 2, 3]
    assignment = _group_assignment(bootstrap, a.group)
    assert set(assignment) == {"tracker-a", "tracker-b"}
    for loop in (a, b):
        by_topic = assignment[loop.client_id]
        assert by_topic == {t: set(loop.owned_partitions()) for t in (names.admissions, names.written, names.commands)}

    ids = _job_ids(per_partition=2)
    first = [jobs[0] for jobs in ids.values()]  # completed in (a)
    second = [jobs[1] for jobs in ids.values()]  # RUNNING when A leaves, completed by B in (b)
    every = set(first + second)
    _publish(producer, names.admissions, [_verdict(j) for j in sorted(every)])
    _publish(producer, names.written, [_receipt(j, 2, 2, 0) for j in first] + [_receipt(j, 1, 1, 0) for j in second])
    _publish(producer, names.written, [_receipt(j, REQUESTS, 2, 1) for j in first])
    events.wait(every, lambda ev: all(e in {(x["job_id"], x["kind"]) for x in ev}
                                      for e in [(j, "COMPLETED") for j in first] + [(j, "RUNNING") for j in second]),
                "COMPLETED for the first job of each partition, RUNNING for the second")
    states.wait(set(first), lambda ev: {x["job_id"] for x in ev if x["state"] == "COMPLETED"} == set(first),
                "the COMPLETED state of every first job")
    events.read(every, 1.0)  # anything more would be a duplicate
    for job_id in first:
        assert events.kinds(job_id) == Counter({"RUNNING": 1, "COMPLETED": 1}), (job_id, events.summary())
        state = states.latest(job_id)
        assert (state["state"], state["requests_total"], state["requests_done"], state["requests_failed"],
                state["lines_written"], state["tokens_in"], state["tokens_out"]) == ("COMPLETED", 3, 2, 1, 3, 30, 8)
        assert state["output_file"] == output_prefix(TENANT, job_id)
    assert a.status()["jobs"] + b.status()["jobs"] == len(every)

    # (b) A leaves: B is given its partitions and reads their jobs back from the changelog
    moved = {j for j in second if topics.partition_of(j) in a.owned_partitions()}
    assert len(moved) == 2
    a.stop()
    _wait(lambda: b.owned_partitions() == [0, 1, 2, 3], "B owns every partition after A left")
    for job_id in moved:
        job = b.tracker.jobs[job_id]
        assert (job.state, job.lines_written, job.done, job.failed, job.tokens_in, job.tokens_out) == \
            (JobState.RUNNING, 1, 1, 0, 10, 4), job_id
    assert all(b.tracker.jobs[j].state is JobState.COMPLETED for j in first)
    assert b.status()["restored"] >= len(every) // 2
    _publish(producer, names.written, [_receipt(j, REQUESTS, REQUESTS, 0) for j in second])
    events.wait(every, lambda ev: {x["job_id"] for x in ev if x["kind"] == "COMPLETED"} == every,
                "COMPLETED for every job")
    states.wait(every, lambda ev: {x["job_id"] for x in ev if x["state"] == "COMPLETED"} == every,
                "the COMPLETED state of every job")
    events.read(every, 1.0)
    for job_id in second:
        assert events.kinds(job_id) == Counter({"RUNNING": 1, "COMPLETED": 1}), (job_id, events.summary())
        state = states.latest(job_id)
        assert (state["requests_done"], state["requests_failed"], state["lines_written"]) == (3, 0, 3)

    # (c) cancels: another tenant's changes nothing, the owner's cancels, a second one changes nothing
    pair = _job_ids(per_partition=2)[0]  # two jobs on one partition: their commands are read in order
    x, y = pair
    _publish(producer, names.admissions, [_verdict(j) for j in pair])
    producer.produce(names.written, x, b"not avro")  # dead-lettered; the loop goes on
    _publish(producer, names.commands, [_cancel(x, "someone-else"), _cancel(y, TENANT), _cancel(y, TENANT)])
    events.wait(set(pair), lambda ev: any(e["job_id"] == y and e["kind"] == "CANCELLED" for e in ev), "y CANCELLED")
    assert events.kinds(x) == Counter() and b.tracker.jobs[x].state is JobState.ADMITTED
    _publish(producer, names.commands, [_cancel(x, TENANT)])
    events.wait(set(pair), lambda ev: any(e["job_id"] == x and e["kind"] == "CANCELLED" for e in ev), "x CANCELLED")
    events.read(set(pair), 0.5)
    assert events.kinds(y) == Counter({"CANCELLED": 1}) and events.kinds(x) == Counter({"CANCELLED": 1})
    assert events.latest(x)["reason"] == f"cancelled by {TENANT}" and events.latest(x)["state"] == "CANCELLED"
    assert b.status()["dead_lettered"] == 1

    # every record read was committed, once its sends and changelog records were acknowledged
    inputs = [TopicPartition(t, p) for t in (names.admissions, names.written, names.commands)
              for p in range(topics.CONTROL_PARTITIONS)]
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": b.group, "enable.auto.commit": False})
    try:
        ends = {(tp.topic, tp.partition): reader.get_watermark_offsets(tp, timeout=10)[1] for tp in inputs}
        _wait(lambda: {(tp.topic, tp.partition): max(0, tp.offset)  # none committed (-1001) where nothing was read
                       for tp in reader.committed(inputs, timeout=10)} == ends,
              f"the group's committed offsets at the inputs' ends {ends}")
    finally:
        reader.close()


class PausingTracker(JobTracker):
    """A tracker that stops inside the handling of one job's receipt until the test lets it go:
    the instance around it stops polling, as in a long pause, and the group puts it out (a zombie)."""

    def __init__(self, config: CoreConfig) -> None:
        super().__init__(config)
        self.pause_on: str | None = None
        self.paused, self.resume = threading.Event(), threading.Event()

    def handle(self, event: TrackerEvent, now: float) -> list[Decision]:
        if isinstance(event, OutputWritten) and event.job_id == self.pause_on:
            self.pause_on = None
            self.paused.set()
            self.resume.wait(90)
        return super().handle(event, now)


def _changelog(bootstrap: str, topic: str) -> dict[str, dict[str, Any] | None]:
    """The changelog as an instance restoring it reads it (committed records only): job id -> last record."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex}",
                       "enable.partition.eof": True, "isolation.level": "read_committed"})
    parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(topics.CONTROL_PARTITIONS)]
    reader.assign(parts)
    out: dict[str, dict[str, Any] | None] = {}
    left, deadline = set(range(topics.CONTROL_PARTITIONS)), time.monotonic() + 20
    try:
        while left:
            assert time.monotonic() < deadline, f"changelog partitions {sorted(left)} not read to their end"
            msg = reader.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                left.discard(msg.partition() or 0)
                continue
            value = msg.value()
            out[(msg.key() or b"").decode()] = None if value is None else json.loads(value)
    finally:
        reader.close()
    return out


def test_a_tracker_put_out_of_the_group_mid_batch_is_fenced(bootstrap: str, names: TrackingTopics) -> None:
    """A pauses inside a batch past its poll interval; B takes every partition and completes the job;
    then A wakes up and commits its stale batch: the group coordinator refuses it, the transaction
    is aborted, and neither A's event nor its stale job record (RUNNING, 2 lines) lands after B's."""
    group = f"test-tracking-{uuid.uuid4().hex[:8]}"
    pausing = PausingTracker(CoreConfig())
    a = TrackingLoop(bootstrap, pausing, "tracker-a", SESSION_S, names=names, group=group,
                     max_poll_interval_s=SESSION_S + 1)
    b = TrackingLoop(bootstrap, JobTracker(CoreConfig()), "tracker-b", SESSION_S, names=names, group=group)
    events = EventReader(bootstrap, topics.JOBS_EVENTS)
    producer = TrackedProducer(bootstrap, "test-tracking")
    job = _job_ids(per_partition=1)[0][0]
    a.start()
    try:
        _wait(lambda: a.owned_partitions() == [0, 1, 2, 3], "A owns every partition")
        _publish(producer, names.admissions, [_verdict(job)])
        _publish(producer, names.written, [_receipt(job, 1, 1, 0)])
        events.wait({job}, lambda ev: any(e["kind"] == "RUNNING" for e in ev), "RUNNING from A")
        pausing.pause_on = job
        _publish(producer, names.written, [_receipt(job, 2, 2, 0)])
        assert pausing.paused.wait(20), "A never read the second receipt"

        b.start()  # the group waits for A's next poll, which does not come within its poll interval
        _wait(lambda: b.owned_partitions() == [0, 1, 2, 3], "B owns every partition once A is put out", 40)
        _wait(lambda: job in b.tracker.jobs and b.tracker.jobs[job].lines_written == 2,
              "B handled the receipt A is stuck on")
        _publish(producer, names.written, [_receipt(job, REQUESTS, REQUESTS, 0)])
        events.wait({job}, lambda ev: any(e["kind"] == "COMPLETED" for e in ev), "COMPLETED from B")
        completed = _changelog(bootstrap, names.changelog)[job]
        assert completed is not None and completed["state"] == "COMPLETED", completed

        pausing.resume.set()  # A's batch (the job at 2 lines, RUNNING) goes to its transaction now
        _wait(lambda: a.status()["transactions_fenced"] == 1, "A's stale batch refused by the group coordinator")
        assert a.status()["rewinds"] == 1 and a.status()["transactions_committed"] >= 1
        events.read({job}, 1.0)
        assert events.kinds(job) == Counter({"RUNNING": 1, "COMPLETED": 1}), events.summary()
        assert _changelog(bootstrap, names.changelog)[job] == completed  # A's record never became visible
    finally:
        pausing.resume.set()
        a.stop()
        b.stop()
