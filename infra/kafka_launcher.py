"""A real single-node Apache Kafka (KRaft) for local runs, tests and CI.

Life of the local broker:
1. ``check_toolchain`` finds Java >= 17 and Maven, or says exactly what to install.
2. ``resolve_jars`` runs ``mvn dependency:copy-dependencies`` on ``infra/kafka/pom.xml`` once per
   Kafka version; the jars land in ``<home>/kafka/<version>/libs`` (Maven's own ~/.m2 cache
   makes a second resolution cheap).
3. ``format_storage`` writes ``server.properties`` and formats the KRaft log directory once
   (``kafka.tools.StorageTool format``); later starts reuse the data.
4. ``start`` launches ``kafka.Kafka`` in its own process group, records its PID under
   ``<home>/run/kafka.pid`` and waits until the broker answers a metadata request.
5. ``phaseroute down`` stops it (by its PID file) after every other recorded process;
   ``phaseroute restart kafka`` stops and starts only the broker, on the same data.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import time
import uuid
from base64 import urlsafe_b64encode
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from phaseroute.config import Settings
from phaseroute.infra import processes

JAVA_MIN_MAJOR = 17
BROKER_MAIN = "kafka.Kafka"
# The local broker's load is small (a dev stack, CI, the demo, benches on 2 cores), and most of
# its CPU was the JIT: a fresh broker beside an idle stack used 0.28 of a core in its first
# 20 s, 0.14 in the next, 0.10 later. C1 alone (no C2 recompilation) and the serial collector
# (no GC worker threads): 0.16, 0.10, 0.10; `bench control` (2 x 20,000 requests) needed no
# more broker CPU with them (42.3 against 47.9 s). A production cluster is configured elsewhere.
BROKER_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
STORAGE_TOOL = "kafka.tools.StorageTool"


class ToolchainError(RuntimeError):
    """Java or Maven is missing or too old; the message says what to install."""


class BrokerStartError(RuntimeError):
    """The broker did not come up; the message carries the tail of its log."""


@dataclass(frozen=True)
class KafkaLayout:
    """Where one Kafka version keeps its jars, config, data and log."""

    root: Path

    @property
    def libs(self) -> Path:
        return self.root / "libs"

    @property
    def config(self) -> Path:
        return self.root / "server.properties"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log_file(self) -> Path:
        return self.root / "broker.log"


def layout_for(settings: Settings) -> KafkaLayout:
    return KafkaLayout(settings.home / "kafka" / settings.kafka_version)


def java_major_version(java: str) -> int:
    """Major version of a ``java`` executable (``java -version`` prints it on stderr)."""
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        raise ToolchainError(f"cannot read the version of {java!r}: {out.stderr.strip()[:200]!r}")
    major = int(match.group(1))
    return int(match.group(2)) if major == 1 and match.group(2) else major


def check_toolchain() -> tuple[str, str]:
    """Return (java, mvn) executables, or raise ToolchainError saying exactly what to install."""
    java = shutil.which("java")
    mvn = shutil.which("mvn")
    missing = []
    if java is None:
        missing.append(f"Java {JAVA_MIN_MAJOR}+ (Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`)")
    if mvn is None:
        missing.append("Apache Maven 3.6+ (Debian/Ubuntu: `apt-get install maven`)")
    if missing:
        raise ToolchainError(
            "the local Kafka broker needs " + " and ".join(missing)
            + "; or point phaseroute at an existing cluster with --bootstrap-servers / PHASEROUTE_BOOTSTRAP_SERVERS"
        )
    assert java is not None and mvn is not None
    major = java_major_version(java)
    if major < JAVA_MIN_MAJOR:
        raise ToolchainError(
            f"{java} is Java {major}; Kafka needs Java {JAVA_MIN_MAJOR}+ "
            "(Debian/Ubuntu: `apt-get install openjdk-17-jre-headless`, then put it first on PATH)"
        )
    return java, mvn


def resolve_jars(settings: Settings, mvn: str) -> Path:
    """Copy the broker's runtime classpath from Maven Central into the layout, once per Kafka
    version and pom: the marker names both, and a classpath resolved from another pom is
    removed first (its jars would stay on ``libs/*`` beside the new ones)."""
    layout = layout_for(settings)
    pom = resources.files("phaseroute.infra") / "kafka" / "pom.xml"
    want = _resolved_marker(settings)
    if jars_resolved(settings):
        return layout.libs
    if layout.libs.exists():
        shutil.rmtree(layout.libs)
    layout.libs.mkdir(parents=True)
    with resources.as_file(pom) as pom_path:
        cmd = [
            mvn, "-q", "-B", "-f", str(pom_path),
            f"-Dkafka.version={settings.kafka_version}",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={layout.libs}", "-DincludeScope=runtime",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not any(layout.libs.glob(f"kafka_2.13-{settings.kafka_version}.jar")):
        raise ToolchainError(
            f"Maven could not resolve Apache Kafka {settings.kafka_version} (exit {proc.returncode}): "
            + (proc.stdout + proc.stderr).strip()[-1500:]
        )
    (layout.libs / ".resolved").write_text(want)
    return layout.libs


def _resolved_marker(settings: Settings) -> str:
    pom = resources.files("phaseroute.infra") / "kafka" / "pom.xml"
    return f"{settings.kafka_version} {hashlib.sha256(pom.read_bytes()).hexdigest()[:16]}"


def jars_resolved(settings: Settings) -> bool:
    """The layout holds the classpath of this Kafka version and this pom."""
    marker = layout_for(settings).libs / ".resolved"
    return marker.exists() and marker.read_text() == _resolved_marker(settings)


def server_properties(settings: Settings, layout: KafkaLayout) -> str:
    """The broker+controller configuration of the single local node."""
    port, cport = settings.kafka_port, settings.kafka_controller_port
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@localhost:{cport}",
        f"listeners=PLAINTEXT://localhost:{port},CONTROLLER://localhost:{cport}",
        f"advertised.listeners=PLAINTEXT://localhost:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        f"log.dirs={layout.data}",
        # topics come from phaseroute.infra.topics (Faust creates its own changelogs)
        "auto.create.topics.enable=false",
        "num.partitions=1",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=8",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=8",
        # the job trackers commit in transactions: one left open by a killed instance is aborted
        # within a second of its timeout, not ten, so readers and the partitions' next owner go on
        "transaction.abort.timed.out.transaction.cleanup.interval.ms=1000",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "log.cleaner.backoff.ms=5000",
        "",
    ])


def new_cluster_id(draw: Callable[[], uuid.UUID] = uuid.uuid4) -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding (22 characters),
    drawn again while it starts with ``-`` (as Kafka's own ``Uuid.randomUuid()`` does): the
    storage tool's argument parser would read ``-t -xyz...`` as a missing value. About 1 draw in
    64 starts with ``-`` (a first byte 0xF8-0xFB). The all-zero id is reserved by Kafka too."""
    while True:
        raw = draw().bytes
        text = urlsafe_b64encode(raw).decode().rstrip("=")
        if not text.startswith("-") and raw != bytes(16):
            return text


def format_storage(settings: Settings, java: str, libs: Path) -> None:
    """Write server.properties and format the KRaft storage the first time only."""
    layout = layout_for(settings)
    layout.config.write_text(server_properties(settings, layout))
    if (layout.data / "meta.properties").exists():
        return
    cluster_id = new_cluster_id()
    cmd = [java, "-cp", f"{libs}/*", STORAGE_TOOL, "format", "-t", cluster_id, "-c", str(layout.config)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BrokerStartError(f"formatting Kafka storage in {layout.data} failed: {(proc.stdout + proc.stderr)[-1500:]}")


def broker_answers(bootstrap: str, timeout_s: float = 2.0) -> bool:
    """True when a metadata request to ``bootstrap`` succeeds."""
    from confluent_kafka.admin import AdminClient

    # log_level 0: a broker that is not up yet is expected here, not worth a log line per retry
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 1000, "log_level": 0})
    try:
        admin.list_topics(timeout=timeout_s)
        return True
    except Exception:  # KafkaException: not up yet
        return False


def _quiet(_message: str) -> None:
    pass


def start(settings: Settings, progress: Callable[[str], None] = _quiet) -> int:
    """Start the local broker unless ours is already running; return its PID. ``progress``
    hears each step (jar resolution, storage format, waiting for the broker)."""
    running = processes.alive_pid(settings.run_dir, "kafka")
    if running is not None:
        progress(f"Kafka already runs (pid {running})")
        return running
    java, mvn = check_toolchain()
    layout = layout_for(settings)
    if not jars_resolved(settings):
        progress(f"resolving Apache Kafka {settings.kafka_version} with Maven (first time and when the pom changes; "
                 "~/.m2 keeps the jars) ...")
    libs = resolve_jars(settings, mvn)
    if not (layout.data / "meta.properties").exists():
        progress(f"formatting the KRaft storage in {layout.data} (first time only) ...")
    format_storage(settings, java, libs)
    log4j = resources.files("phaseroute.infra") / "kafka" / "log4j2.properties"
    cmd = [
        java, f"-Xmx{settings.kafka_heap}", f"-Xms{settings.kafka_heap}", *BROKER_JVM_OPTIONS,
        f"-Dlog4j2.configurationFile={log4j}", f"-Dphaseroute.kafka.log={layout.log_file}",
        "-cp", f"{libs}/*", BROKER_MAIN, str(layout.config),
    ]
    pid = processes.spawn(settings.run_dir, "kafka", cmd, log_path=layout.root / "stdout.log")
    bootstrap = settings.bootstrap_servers
    progress(f"started the broker (pid {pid}); waiting for it to answer on {bootstrap} ...")
    started = time.monotonic()
    deadline = started + settings.kafka_start_timeout_s
    while time.monotonic() < deadline:
        if processes.alive_pid(settings.run_dir, "kafka") is None:
            raise BrokerStartError(f"Kafka exited during start-up; last log lines:\n{_tail(layout)}")
        if broker_answers(bootstrap):
            progress(f"Kafka {settings.kafka_version} (KRaft, single node) answers on {bootstrap} after "
                     f"{time.monotonic() - started:.1f} s")
            return pid
        time.sleep(0.5)
    processes.stop(settings.run_dir, "kafka")
    raise BrokerStartError(
        f"Kafka did not answer on {bootstrap} within {settings.kafka_start_timeout_s:.0f} s; last log lines:\n{_tail(layout)}"
    )


def _tail(layout: KafkaLayout, lines: int = 30) -> str:
    chunks = []
    for path in (layout.root / "stdout.log", layout.log_file):
        if path.exists():
            chunks.extend(path.read_text(errors="replace").splitlines()[-lines:])
    return "\n".join(chunks) or "(no log written)"


if __name__ == "__main__":  # pragma: no cover - manual use: python -m phaseroute.infra.kafka_launcher
    from phaseroute.config import settings

    print(start(settings()), file=sys.stderr)
