"""confluent-kafka -> Faust agent -> confluent-kafka through the real broker, with the shared
serde on both sides: the bytes one client writes are the records the other reads, keyed
messages land on the same partitions in both clients, and garbage becomes a dead letter."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import faust
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from phaseroute.schemas import serde
from phaseroute.schemas.examples import T0, example
from phaseroute.schemas.faust_codec import CODEC_NAME, Undecodable
from phaseroute.schemas.ids import job_event_id
from phaseroute.schemas.records import JobEvent, JobSubmitted

pytestmark = pytest.mark.kafka
PARTITIONS = 3
JOB_IDS = [f"acme-roundtrip-{i}" for i in range(6)]
GARBAGE = b'{"job_id": "not avro"}'


def _produce_jobs(bootstrap: str, topic: str) -> dict[str, int]:
    """Produce one job_submitted per job id and the garbage; return job_id -> partition."""
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "enable.idempotence": True})
    placed: dict[str, int] = {}

    def delivered(err, msg) -> None:
        assert err is None, err
        placed[msg.key().decode()] = msg.partition()

    for job_id in JOB_IDS:
        record = example("job_submitted") | {"job_id": job_id}
        producer.produce(topic, key=job_id.encode(), value=serde.encode("job_submitted", record), on_delivery=delivered)
        producer.poll(0)
    producer.produce(topic, key=b"garbage", value=GARBAGE, on_delivery=delivered)
    assert producer.flush(30) == 0
    return placed


def _admitted(job: JobSubmitted) -> JobEvent:
    return JobEvent(
        event_id=job_event_id(job.job_id, "ADMITTED"), job_id=job.job_id, tenant=job.tenant, kind="ADMITTED",
        state="ADMITTED", model=job.model, priority=job.priority, submitted_at=job.submitted_at,
        deadline=job.deadline, requests_total=len(job.requests), at=T0 + 1_000,
    )


def _run_faust(bootstrap: str, source: str, sink: str, dead: str, expected: int, datadir: Path) -> None:
    app = faust.App(
        f"test-schemas-{uuid.uuid4().hex[:8]}", broker=f"kafka://{bootstrap}", store="memory://", datadir=str(datadir),
        web_enabled=False, topic_partitions=PARTITIONS, topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
    )
    jobs = app.topic(source, key_serializer="raw", value_serializer=f"{CODEC_NAME}.job_submitted")
    events = app.topic(sink, key_serializer="raw", value_serializer=CODEC_NAME)
    letters = app.topic(dead, key_serializer="raw", value_serializer=f"{CODEC_NAME}.dead_letter")
    seen: list[str] = []

    @app.agent(jobs)
    async def admit(stream):
        async for event in stream.events():
            msg = event.message
            if isinstance(event.value, Undecodable):
                letter = event.value.to_dead_letter(msg.key, msg.topic, msg.partition, msg.offset, "test", T0)
                await letters.send(key=msg.topic.encode(), value=letter)
            else:
                await events.send(key=event.value.job_id.encode(), value=_admitted(event.value))
            seen.append(msg.topic)

    async def main() -> None:
        await app.start()
        try:
            deadline = time.monotonic() + 60
            while len(seen) < expected and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            await app.producer.flush()
        finally:
            await app.stop()
        assert len(seen) == expected, f"the Faust agent saw {len(seen)} of {expected} messages in 60 s"

    try:
        asyncio.run(main())
    finally:
        leader_topic = f"{app.conf.id}-__assignor-__leader"  # Faust's own topic: remove it too
        admin = AdminClient({"bootstrap.servers": bootstrap})  # keep a reference until the futures resolve
        for future in admin.delete_topics([leader_topic]).values():
            future.exception(timeout=30)


def _consume(bootstrap: str, topics: list[str], expected: int) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50})
    consumer.subscribe(topics)
    messages = []
    try:
        deadline = time.monotonic() + 30
        while len(messages) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                messages.append(msg)
    finally:
        consumer.close()
    return messages


def test_confluent_to_faust_and_back(bootstrap: str, make_topic: Callable[..., str], tmp_path: Path) -> None:
    source = make_topic("jobs", partitions=PARTITIONS)
    sink = make_topic("events", partitions=PARTITIONS)
    dead = make_topic("dead", partitions=1)
    placed = _produce_jobs(bootstrap, source)

    _run_faust(bootstrap, source, sink, dead, expected=len(JOB_IDS) + 1, datadir=tmp_path)
    messages = _consume(bootstrap, [sink, dead], expected=len(JOB_IDS) + 1)

    events = {m.key().decode(): (m.partition(), serde.decode(m.value(), "job_event")[1]) for m in messages if m.topic() == sink}
    assert set(events) == set(JOB_IDS)
    for job_id, (partition, event) in events.items():
        # aiokafka (Faust) and confluent-kafka with murmur2_random agree on the partition of a key.
        assert partition == placed[job_id], job_id
        assert event == _admitted(JobSubmitted.from_dict(example("job_submitted") | {"job_id": job_id})).to_dict()

    (letter_msg,) = [m for m in messages if m.topic() == dead]
    kind, letter = serde.decode(letter_msg.value(), "dead_letter")
    assert letter["value"] == GARBAGE and letter["key"] == b"garbage" and letter["stage"] == "DECODE"
    assert letter["reason"].startswith("not Avro single-object encoding: first bytes 0x7b226a6f625f6964223a")
    assert f"read from topic {source} partition {placed['garbage']}" in letter["reason"]
