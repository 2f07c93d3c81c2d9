"""The local Kafka launcher: toolchain errors, and `up`/`down` on a broker of the test's own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from phaseroute.infra import kafka_launcher, processes


def test_missing_java_and_maven_say_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no java, no mvn
    with pytest.raises(kafka_launcher.ToolchainError) as err:
        kafka_launcher.check_toolchain()
    message = str(err.value)
    assert "Java 17+" in message and "apt-get install openjdk-17-jre-headless" in message
    assert "apt-get install maven" in message
    assert "--bootstrap-servers" in message


def test_too_old_java_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_java = tmp_path / "java"  # a stand-in that answers like Java 11
    fake_java.write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    fake_java.chmod(0o755)
    (tmp_path / "mvn").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "mvn").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(kafka_launcher.ToolchainError, match=r"is Java 11; Kafka needs Java 17\+"):
        kafka_launcher.check_toolchain()


def test_jars_are_resolved_again_when_the_pom_changes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The classpath is ``libs/*``: jars of an earlier pom must not stay beside the new ones."""
    from phaseroute.config import load_settings

    monkeypatch.setenv("PHASEROUTE_HOME", str(tmp_path / "home"))
    settings = load_settings()
    calls = tmp_path / "mvn-calls"
    mvn = tmp_path / "mvn"  # a stand-in for Maven that copies one jar named for the version asked
    mvn.write_text('#!/bin/sh\necho "$@" >> ' + str(calls) + '\nfor a in "$@"; do case "$a" in\n'
                   '  -Dkafka.version=*) v=${a#-Dkafka.version=};;\n  -DoutputDirectory=*) out=${a#-DoutputDirectory=};;\n'
                   'esac; done\ntouch "$out/kafka_2.13-$v.jar"\n')
    mvn.chmod(0o755)
    libs = kafka_launcher.resolve_jars(settings, str(mvn))
    assert (libs / f"kafka_2.13-{settings.kafka_version}.jar").exists()
    assert kafka_launcher.resolve_jars(settings, str(mvn)) == libs
    assert len(calls.read_text().splitlines()) == 1  # the same pom: resolved once
    (libs / "slf4j-api-1.7.36.jar").touch()  # a jar an earlier pom brought
    (libs / ".resolved").write_text(f"{settings.kafka_version} 0123456789abcdef")  # resolved from another pom
    kafka_launcher.resolve_jars(settings, str(mvn))
    assert len(calls.read_text().splitlines()) == 2
    assert sorted(p.name for p in libs.iterdir()) == [".resolved", f"kafka_2.13-{settings.kafka_version}.jar"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_up_answers_and_down_leaves_no_process(tmp_path: Path) -> None:
    """A second broker on free ports, in a state directory of this test's own."""
    port, controller_port = free_port(), free_port()
    env = {
        **os.environ, "PHASEROUTE_HOME": str(tmp_path), "PHASEROUTE_KAFKA_PORT": str(port),
        "PHASEROUTE_KAFKA_CONTROLLER_PORT": str(controller_port), "PHASEROUTE_KAFKA_HEAP": "256m",
    }
    env.pop("PHASEROUTE_BOOTSTRAP_SERVERS", None)
    cli = [sys.executable, "-m", "phaseroute.cli.main"]
    started = time.monotonic()
    up = subprocess.run([*cli, "up"], env=env, capture_output=True, text=True, timeout=240)
    assert up.returncode == 0, up.stderr
    pid = processes.alive_pid(tmp_path / "run", "kafka")
    assert pid is not None
    try:
        assert kafka_launcher.broker_answers(f"localhost:{port}")
        topics = subprocess.run([*cli, "topics", "--json"], env=env, capture_output=True, text=True, timeout=60)
        assert topics.returncode == 0, topics.stderr
        assert '"topic": "jobs.state"' in topics.stdout and '"status": "ok"' in topics.stdout
        print(f"up answered after {time.monotonic() - started:.1f} s (includes jar resolution from ~/.m2)")
        # the broker logs through log4j: with slf4j-api 1.7 on its classpath it logged nothing at all
        (broker_log,) = (tmp_path / "kafka").glob("*/broker.log")
        assert "Kafka Server started" in broker_log.read_text(), "the broker wrote no log (see stdout.log)"
        assert "no-operation (NOP) logger" not in (broker_log.parent / "stdout.log").read_text()
        meta = sorted((tmp_path / "kafka").glob("*/data/meta.properties"))
        cluster_before = [p.read_text() for p in meta]
        assert cluster_before and "cluster.id=" in cluster_before[0]
        restart = subprocess.run([*cli, "restart", "kafka"], env=env, capture_output=True, text=True, timeout=240)
        assert restart.returncode == 0, restart.stderr
        assert "Kafka stopped on SIGTERM" in restart.stderr and "answers on" in restart.stderr
        new_pid = processes.alive_pid(tmp_path / "run", "kafka")
        assert new_pid is not None and new_pid != pid and processes.wait_gone(pid, 10)
        assert [p.read_text() for p in (tmp_path / "kafka").glob("*/data/meta.properties")] == cluster_before
        again = subprocess.run([*cli, "topics", "--json", "--check", "jobs.state"], env=env, capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and '"status": "ok"' in again.stdout, again.stderr  # same data after the restart
        unknown = subprocess.run([*cli, "restart", "no-such-process"], env=env, capture_output=True, text=True, timeout=60)
        assert unknown.returncode == 1 and "no process named 'no-such-process' is recorded" in unknown.stderr
        pid = new_pid
    finally:
        down = subprocess.run([*cli, "down"], env=env, capture_output=True, text=True, timeout=60)
    assert down.returncode == 0, down.stderr
    assert processes.wait_gone(pid, 10)
    ours = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert ours == [], f"processes left behind: {[p.info['cmdline'][:3] for p in ours]}"
    assert not kafka_launcher.broker_answers(f"localhost:{port}", timeout_s=1)


def test_cluster_ids_never_start_with_a_dash_over_many_draws() -> None:
    """`kafka-storage format -t -xyz...` stops with "expected one argument": about 1 random id in
    64 starts with '-'. Every id handed out is 22 URL-safe base64 characters of 16 bytes, never
    '-'-led, and the rejected draws really happened (so the test saw the case it guards)."""
    import base64
    import uuid

    draws: list[uuid.UUID] = []

    def counted() -> uuid.UUID:
        draws.append(uuid.uuid4())
        return draws[-1]

    ids = [kafka_launcher.new_cluster_id(counted) for _ in range(10_000)]
    assert not [i for i in ids if i.startswith("-")]
    assert {len(i) for i in ids} == {22}
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids[:500])
    redrawn = len(draws) - len(ids)
    assert 50 <= redrawn <= 320, f"{redrawn} of {len(draws)} draws started with '-' (expected about 1 in 64)"


def test_a_dash_led_draw_is_drawn_again() -> None:
    import uuid

    dash_led = uuid.UUID(bytes=bytes([0xF8]) + bytes(range(15)))  # base64 of 0xF8.. starts with '-'
    fine = uuid.UUID(bytes=bytes(range(1, 17)))
    queue = [dash_led, uuid.UUID(int=0), fine]
    assert kafka_launcher.new_cluster_id(lambda: queue.pop(0)) == "AQIDBAUGBwgJCgsMDQ4PEA"
    assert queue == []
