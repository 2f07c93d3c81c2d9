"""A cluster that needs SASL: with ``PHASEROUTE_KAFKA_CLIENT_CONFIG`` every kind of Kafka client
phaseroute makes reaches it, and without it (or with a wrong password) the command fails.

A second, real broker (the jars `./dev.sh test` resolved) listens with SASL_PLAINTEXT and the
PLAIN mechanism only. Each check is a real process, as an operator runs it: `up` provisions the
topics through the admin client; `tenants add` / `tenants list` use the API's producer and
reader; a data-plane producer, a consumer of a group and a view follower round-trip one record;
the control plane (Faust, through aiokafka's credentials) joins its consumer group.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from phaseroute.config import load_settings
from phaseroute.infra import kafka_launcher
from phaseroute.infra.topics import CONTROL_APP_ID

pytestmark = pytest.mark.kafka

USER, PASSWORD = "phaseroute", "pr-secret"
CLI = [sys.executable, "-m", "phaseroute.cli.main"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _client_config(password: str = PASSWORD) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": USER, "sasl.password": password}


def _properties(root: Path, port: int, cport: int) -> str:
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="admin-secret" '
            f'user_admin="admin-secret" user_{USER}="{PASSWORD}";')
    return "\n".join([
        "process.roles=broker,controller", "node.id=1", f"controller.quorum.voters=1@localhost:{cport}",
        f"listeners=SASL_PLAINTEXT://localhost:{port},CONTROLLER://localhost:{cport}",
        f"advertised.listeners=SASL_PLAINTEXT://localhost:{port}",
        "controller.listener.names=CONTROLLER", "inter.broker.listener.name=SASL_PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms=PLAIN", "sasl.mechanism.inter.broker.protocol=PLAIN",
        f"listener.name.sasl_plaintext.plain.sasl.jaas.config={jaas}",
        f"log.dirs={root / 'data'}", "auto.create.topics.enable=false", "num.partitions=1",
        "offsets.topic.replication.factor=1", "offsets.topic.num.partitions=4",
        "transaction.state.log.replication.factor=1", "transaction.state.log.min.isr=1",
        "share.coordinator.state.topic.replication.factor=1", "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0", "",
    ])


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    java, mvn = kafka_launcher.check_toolchain()
    libs = kafka_launcher.resolve_jars(load_settings(), mvn)
    root = tmp_path_factory.mktemp("sasl-broker")
    port, cport = _free_port(), _free_port()
    config = root / "server.properties"
    config.write_text(_properties(root, port, cport))
    subprocess.run([java, "-cp", f"{libs}/*", kafka_launcher.STORAGE_TOOL, "format", "-t", kafka_launcher.new_cluster_id(),
                    "-c", str(config)], check=True, capture_output=True, timeout=120)
    with (root / "broker.log").open("w") as log:
        broker = subprocess.Popen([java, "-Xmx384m", "-cp", f"{libs}/*", kafka_launcher.BROKER_MAIN, str(config)],
                                  stdout=log, stderr=subprocess.STDOUT)
    bootstrap = f"localhost:{port}"
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap, **_client_config(), "log_level": 0})
        deadline = time.monotonic() + 90
        while True:
            try:
                admin.list_topics(timeout=2)
                break
            except Exception:
                assert broker.poll() is None, (root / "broker.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the SASL broker did not answer in 90 s"
                time.sleep(0.5)
        yield bootstrap
    finally:
        broker.terminate()
        try:
            broker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            broker.kill()


def _env(tmp_path: Path, bootstrap: str, client_config: dict[str, str] | None) -> dict[str, str]:
    env = {**os.environ, "PHASEROUTE_HOME": str(tmp_path), "PHASEROUTE_BOOTSTRAP_SERVERS": bootstrap}
    env.pop("PHASEROUTE_KAFKA_CLIENT_CONFIG", None)
    if client_config is not None:
        env["PHASEROUTE_KAFKA_CLIENT_CONFIG"] = json.dumps(client_config)
    return env


def _run(args: list[str], env: dict[str, str], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout_s)


ROUND_TRIP = textwrap.dedent("""
    import sys, threading
    from phaseroute.consumers.kafka_clients import TrackedProducer, new_consumer
    from phaseroute.schemas import serde
    from phaseroute.infra.topic_follower import TopicFollower
    bootstrap, topic = sys.argv[1], "deadletter"
    record = {"source_topic": "t", "partition": 0, "offset": 0, "key": None, "value": b"x", "reason": "sasl round trip",
              "error_class": "none", "stage": "DECODE", "expected_kind": None, "traceback": None, "service": "test", "at": 0}
    producer = TrackedProducer(bootstrap, "sasl-test")
    producer.produce(topic, "k", serde.encode("dead_letter", record))
    producer.flush_or_raise()
    consumer = new_consumer(bootstrap, "sasl-test-group", "sasl-test")
    consumer.subscribe([topic])
    got = None
    for _ in range(60):
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            got = serde.decode(msg.value())[1]["reason"]
            break
    consumer.close()
    seen = []
    follower = TopicFollower(bootstrap, topic, "dead_letter", seen.append)
    follower.start()
    follower.caught_up.wait(30)
    follower.stop()
    print(got, len(seen))
""")


def test_every_client_reaches_a_sasl_cluster_with_the_client_config(sasl_broker: str, tmp_path: Path) -> None:
    env = _env(tmp_path, sasl_broker, _client_config())
    up = _run([*CLI, "up"], env)
    assert up.returncode == 0, up.stderr[-2000:]
    assert "created" in up.stdout + up.stderr
    added = _run([*CLI, "tenants", "add", "acme", "--weight", "2"], env)
    assert added.returncode == 0, added.stderr[-2000:]
    listed = _run([*CLI, "tenants", "list", "--json"], env)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert [t["name"] for t in json.loads(listed.stdout)] == ["acme"]

    trip = _run([sys.executable, "-c", ROUND_TRIP, sasl_broker], env)
    assert trip.returncode == 0, trip.stderr[-2000:]
    assert trip.stdout.split() == ["sasl", "round", "trip", "1"]

    # its log goes to a file: Faust logs tens of KB at start, which would fill an undrained pipe and stall it
    log = tmp_path / "control.log"
    with open(log, "wb") as out:
        control = subprocess.Popen([*CLI, "control"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        admin = AdminClient({"bootstrap.servers": sasl_broker, **_client_config(), "log_level": 0})
        deadline, groups = time.monotonic() + 300, []
        while time.monotonic() < deadline and CONTROL_APP_ID not in groups:
            assert control.poll() is None, f"the control plane exited {control.returncode}: {log.read_text()[-3000:]}"
            groups = [g.group_id for g in admin.list_consumer_groups().result(timeout=10).valid]
            time.sleep(2)
        assert CONTROL_APP_ID in groups, (f"the control plane's Faust consumer did not join the SASL cluster: {groups}; "
                                          f"its log ends: {log.read_text()[-3000:]}")
    finally:
        control.terminate()
        control.wait(timeout=60)


@pytest.mark.parametrize("client_config", [None, _client_config("wrong")], ids=["no config", "wrong password"])
def test_without_the_right_credentials_a_command_fails_clearly(sasl_broker: str, tmp_path: Path,
                                                               client_config: dict[str, str] | None) -> None:
    listed = _run([*CLI, "tenants", "list", "--json"], _env(tmp_path, sasl_broker, client_config), timeout_s=90)
    assert listed.returncode != 0
    assert sasl_broker in listed.stderr and "Traceback" not in listed.stderr
