"""The control plane's corrections to Faust (``streams/faust_fixes.py``), on the real broker.

After every rebalance Faust seeks its input partitions back to their committed offsets
(``perform_seek``), because records it fetched meanwhile may have been dropped; aiokafka seeks
only where the committed offset is above 0, so a partition the group never committed is not
rewound and such records are lost. Measured: a control plane that started with 24 drift canaries
waiting in a new partition of ``requests.pending`` processed 1 of them; the drift test waited
400 s for the rest. The loss itself depends on timing; what the correction changes does not, and
is what these tests pin: after the rewind, a never-committed partition is read again from its
start (the control core ignores records it has seen, as after a crash).

The producer's metadata forgets every topic but the new one when the app first sends to a topic
created after it started (a pool added to the running stack); a table write then found no
partitions for its changelog and raised. With the correction it lands where it always did.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = [pytest.mark.kafka]
APP = Path(__file__).with_name("faust_fresh_partition_app.py")
LATE_TOPIC_APP = Path(__file__).with_name("faust_late_topic_app.py")
PARTITIONS, WAITING = 2, 20


def _run(bootstrap: str, as_is: bool, tmp_path: Path) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The (partition, offset) records the app processed before and after its rewind."""
    tag = uuid.uuid4().hex[:8]
    app_id, source = f"test-faust-fix-{tag}", f"test.faust-fix.{tag}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(source, PARTITIONS, 1)])[source].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(PARTITIONS):
        for i in range(WAITING):
            producer.produce(source, f"{partition}-{i}".encode(), key=f"r{partition}-{i}".encode(), partition=partition)
    producer.flush(60)
    name = "as-is" if as_is else "fixed"
    out, log = tmp_path / f"{name}.out", tmp_path / f"{name}.log"
    with open(out, "w") as stdout, open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(APP), bootstrap, app_id, source, "--rewind-after",
                                 str(PARTITIONS * WAITING), *(["--as-is"] if as_is else [])], stdout=stdout, stderr=stderr,
                                cwd=tmp_path)  # Faust writes its data dir in its working directory
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and "rewound" not in out.read_text(errors="replace"):
            time.sleep(0.5)
        time.sleep(8.0)  # what the rewind brings back arrives within a fetch or two
        alive = proc.poll() is None
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        admin.delete_topics([source])[source].result(timeout=30)
    text = out.read_text(errors="replace")
    assert alive and "rewound" in text, f"the Faust app did not get to its rewind: {log.read_text()[-3000:]}"
    before, _, after = text.partition("rewound")
    return _records(before), _records(after)


def _records(text: str) -> list[tuple[int, int]]:
    """The app's ``record <partition> <offset>`` lines (Faust writes terminal codes there too)."""
    return [(int(p), int(o)) for _, p, o in (line.split() for line in text.splitlines() if line.startswith("record "))]


def test_a_never_committed_partition_is_read_again_from_its_start_after_a_rebalance(bootstrap: str, tmp_path: Path) -> None:
    before, after = _run(bootstrap, as_is=False, tmp_path=tmp_path)
    every = {(p, o) for p in range(PARTITIONS) for o in range(WAITING)}
    print(f"\nwith the correction: {len(before)} records, then {len(after)} again after the rewind")
    assert set(before) == every and len(before) == len(every)
    assert set(after) == every and len(after) == len(every), sorted(every - set(after))


def test_faust_as_shipped_does_not_rewind_it(bootstrap: str, tmp_path: Path) -> None:
    """What the correction is for: as shipped, the rewind leaves such a partition where it was."""
    before, after = _run(bootstrap, as_is=True, tmp_path=tmp_path)
    print(f"\nFaust as shipped: {len(before)} records, then {len(after)} after the rewind")
    assert len(before) == PARTITIONS * WAITING and after == [], after


def _run_late_topic(bootstrap: str, as_is: bool, tmp_path: Path) -> tuple[str, dict[int, int]]:
    """The app's output, and how many changelog records of its one key each partition holds."""
    tag = uuid.uuid4().hex[:8]
    app_id, source = f"test-faust-late-{tag}", f"test.faust-late.{tag}"
    changelog = f"{app_id}-counts-changelog"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(source, 2, 1)])[source].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(source, b"go", key=b"go")
    producer.flush(60)
    out = tmp_path / f"late-{'as-is' if as_is else 'fixed'}.out"
    with open(out, "w") as stdout:
        proc = subprocess.Popen([sys.executable, str(LATE_TOPIC_APP), bootstrap, app_id, source,
                                 *(["--as-is"] if as_is else [])], stdout=stdout, stderr=subprocess.STDOUT,
                                cwd=tmp_path)  # Faust writes its data dir in its working directory
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and "done" not in out.read_text(errors="replace"):
            time.sleep(0.5)
    finally:
        proc.kill()  # nothing to hand back: the test reads what was written
        proc.wait(30)
    try:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-late-{tag}", "enable.auto.commit": False})
        per_partition: dict[int, int] = {}
        for partition in range(2):
            low, high = consumer.get_watermark_offsets(TopicPartition(changelog, partition), timeout=30)
            per_partition[partition] = high - low
        consumer.close()
    finally:
        for future in admin.delete_topics([source, f"{source}.late", changelog]).values():
            try:
                future.result(timeout=30)
            except Exception:
                pass
    return out.read_text(errors="replace"), per_partition


def test_a_table_write_after_a_send_to_a_late_topic_lands_on_its_partition(bootstrap: str, tmp_path: Path) -> None:
    text, per_partition = _run_late_topic(bootstrap, as_is=False, tmp_path=tmp_path)
    assert "done" in text, text[-3000:]
    assert all(f"write {n} ok" in text for n in (1, 2, 3)), text[-3000:]
    assert sorted(per_partition.values()) == [0, 3], per_partition  # the three writes of one key, on one partition


def test_faust_as_shipped_fails_that_write(bootstrap: str, tmp_path: Path) -> None:
    """What the correction is for: as shipped, the write after the send raises."""
    text, _ = _run_late_topic(bootstrap, as_is=True, tmp_path=tmp_path)
    assert "write 1 ok" in text, text[-3000:]
    assert "write 2 failed TypeError" in text, text[-3000:]


def test_the_producer_flush_a_commit_starts_with_writes_the_apps_state_first() -> None:
    """Faust flushes the producer after it chose the offsets to commit and before it commits
    them; with the correction that flush first calls ``write_state`` (the control core's
    write-behind), so every committed event's state is among the writes it waits for."""
    import asyncio

    import faust

    from phaseroute.streams.faust_fixes import drain_table_writes_before_commits

    calls: list[str] = []
    app = faust.App(f"test-write-state-{uuid.uuid4().hex[:6]}", broker="kafka://127.0.0.1:1", store="memory://",
                    web_enabled=False)
    drain_table_writes_before_commits(app, write_state=lambda: calls.append("state written"))
    asyncio.run(app.producer.flush())
    assert calls == ["state written"]
