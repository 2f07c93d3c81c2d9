"""An app stopped before it was ready to handle its agents' events (``hold_until_ready`` in
``streams/faust_fixes.py``), on the real broker.

The control plane's agents hold each event until the instance restored its core. A standby that
got SIGTERM right after it took the control lease, before its restore, hung in Faust's stop
(which waits for every held event to be acked) until it was killed 60 s later. With
``hold_until_ready`` the app stops within seconds, commits no offset past the held event, and the
next run of the group reads and handles it: nothing lost, no hang."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

pytestmark = [pytest.mark.kafka]
UNREADY_APP = Path(__file__).with_name("faust_unready_app.py")
STOPPED_WITHIN_S = 30.0  # a stop with nothing to wait for: Faust's own steps, on a busy machine
AS_IS_WAIT_S = 15.0  # how long the uncorrected app is watched still hanging after its SIGTERM


def _start(bootstrap: str, app_id: str, source: str, out: Path, *flags: str) -> subprocess.Popen[bytes]:
    with open(out, "w") as stdout:
        return subprocess.Popen([sys.executable, str(UNREADY_APP), bootstrap, app_id, source, *flags], stdout=stdout,
                                stderr=subprocess.STDOUT, cwd=out.parent)  # Faust writes its data dir there


def _wait_for(out: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> str:
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        seen = out.read_text(errors="replace")
        if text in seen:
            return seen
        time.sleep(0.3)
    raise AssertionError(f"{text!r} never appeared (exit {proc.poll()}): {out.read_text(errors='replace')[-3000:]}")


def _stopped_within(proc: subprocess.Popen[bytes], timeout_s: float) -> float | None:
    """Seconds the process took to exit after SIGTERM, or None if it was still running (then killed)."""
    started = time.time()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout_s)
        return time.time() - started
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        return None


def _committed(bootstrap: str, group: str, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        [tp] = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        return int(tp.offset)  # negative: nothing committed
    finally:
        consumer.close()


@pytest.fixture
def source(bootstrap: str) -> Iterator[tuple[str, str]]:
    """A one-partition topic holding one record (offset 0), and a fresh group id to read it with."""
    tag = uuid.uuid4().hex[:8]
    topic = f"test.faust-unready.{tag}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"work", key=b"k")
    producer.flush(60)
    yield topic, f"test-faust-unready-{tag}"
    admin.delete_topics([topic])[topic].result(timeout=30)


def test_an_app_stopped_before_it_was_ready_stops_at_once_and_leaves_its_event_to_the_next_run(
        bootstrap: str, source: tuple[str, str], tmp_path: Path) -> None:
    topic, app_id = source
    proc = _start(bootstrap, app_id, topic, tmp_path / "unready.out")
    _wait_for(tmp_path / "unready.out", "holding 0 0", proc)
    time.sleep(3.0)  # commits run meanwhile (every second): none may cover the held event
    took = _stopped_within(proc, STOPPED_WITHIN_S)
    print(f"\nstopped {took and round(took, 1)} s after SIGTERM; committed offset {_committed(bootstrap, app_id, topic)}")
    assert took is not None, f"still running {STOPPED_WITHIN_S} s after SIGTERM"
    assert _committed(bootstrap, app_id, topic) <= 0, "a commit covered the event the app never handled"
    again = _start(bootstrap, app_id, topic, tmp_path / "again.out", "--ready-after", "0")
    try:
        _wait_for(tmp_path / "again.out", "record 0 0", again)
    finally:
        again.kill()
        again.wait(30)


def test_the_plain_wait_leaves_faust_waiting_for_the_held_event(
        bootstrap: str, source: tuple[str, str], tmp_path: Path) -> None:
    """What the correction is for: an agent that waits in a plain loop keeps Faust's stop waiting."""
    topic, app_id = source
    proc = _start(bootstrap, app_id, topic, tmp_path / "as-is.out", "--as-is")
    _wait_for(tmp_path / "as-is.out", "holding 0 0", proc)
    assert _stopped_within(proc, AS_IS_WAIT_S) is None, "the uncorrected app stopped: the correction may be moot"
