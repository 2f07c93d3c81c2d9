"""``phaseroute pools``: the pools that run now, per phase: workers alive, consumer lag, throughput.

Everything comes from Kafka, so it works while the telemetry service owns the embedded chdb:

* workers: the latest ``pools.heartbeat`` record of each worker since ``now - window_s``
  (read from the offsets of that time); a worker is alive when its latest heartbeat says UP
  and is at most ``MISSED_BEATS`` of its intervals old. A pool shows when its workers beat in
  the window or ``phaseroute up`` recorded it (then ``starting`` until the first heartbeat);
  ``--all`` adds the pools of earlier stacks that only topics and consumer groups remember.
* lag: committed offsets of the group ``phaseroute.<phase>.<pool>`` against the high
  watermarks of ``prefill.<pool>`` / ``decode.<pool>`` (both for colocated workers); a
  partition the group never committed counts everything retained on it.
* throughput: prompt tokens (PREFILL) and generated tokens (DECODE) of the OK batches in
  ``telemetry.phase`` finished within the window, per second of the window.
"""

from __future__ import annotations

import enum
import os
import re
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import typer
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from phaseroute.cli import control_status
from phaseroute.cli.common import console, current_settings, errors_as_messages, json_stdout, print_table
from phaseroute.infra.group_admin import while_coordinator_loads
from phaseroute.infra.kafka_security import with_cluster_config
from phaseroute.infra.topics import POOL_NAME
from phaseroute.schemas import serde

POOLS_HEARTBEAT = "pools.heartbeat"
TELEMETRY_TOPIC = "telemetry.phase"
MISSED_BEATS = 3
GROUP = re.compile(r"^phaseroute\.(prefill|decode|both)\.(.+)$")
PHASE_TOPICS = {"prefill": ("prefill",), "decode": ("decode",), "both": ("prefill", "decode")}
TELEMETRY_PHASE = {"PREFILL": "prefill", "DECODE": "decode", "COLOCATED": "both"}


@dataclass(frozen=True)
class Sources:
    """Where to read (tests and prefixed deployments use their own topics)."""

    bootstrap: str
    heartbeat_topic: str = POOLS_HEARTBEAT
    telemetry_topic: str = TELEMETRY_TOPIC
    timeout_s: float = 10.0


def _epoch_s(value: Any) -> float:
    seconds: float = value.timestamp() if hasattr(value, "timestamp") else value / 1000.0
    return seconds


def read_since(consumer: Consumer, topic: str, since_s: float, kind: str, timeout_s: float) -> list[dict[str, Any]]:
    """Every decodable ``kind`` record on ``topic`` written at or after ``since_s`` (up to the
    high watermarks at the time of the call)."""
    meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if meta is None or meta.error is not None:
        return []
    asked = [TopicPartition(topic, p, int(since_s * 1000)) for p in meta.partitions]
    starts = consumer.offsets_for_times(asked, timeout=timeout_s)
    pending = set()
    for tp in starts:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=timeout_s)
        if 0 <= tp.offset < high:
            pending.add(tp.partition)
    consumer.assign([tp for tp in starts if tp.partition in pending])
    records, deadline = [], time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for msg in consumer.consume(500, 0.5):
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                continue
            value = msg.value()
            if value is None:  # a tombstone: nothing to decode
                continue
            try:
                records.append(serde.decode(value, kind)[1])
            except Exception:
                continue
    consumer.unassign()
    return records


def worker_states(heartbeats: list[dict[str, Any]], now: float) -> dict[str, dict[str, Any]]:
    """worker_id -> its latest heartbeat, judged alive or not at ``now``."""
    latest: dict[str, dict[str, Any]] = {}
    for hb in heartbeats:
        if hb["worker_id"] not in latest or _epoch_s(hb["at"]) >= _epoch_s(latest[hb["worker_id"]]["at"]):
            latest[hb["worker_id"]] = hb
    states = {}
    for worker_id, hb in latest.items():
        age = now - _epoch_s(hb["at"])
        interval = float(hb.get("interval_s") or 5.0)
        alive = hb["status"] == "UP" and age <= MISSED_BEATS * interval
        states[worker_id] = {
            "worker_id": worker_id, "pool": hb["pool"], "phase": str(hb["phase"]).lower(), "status": hb["status"],
            "alive": alive, "age_s": round(age, 1), "interval_s": interval, "queue_depth": hb["queue_depth"],
        }
    return states


def group_lag(admin: AdminClient, consumer: Consumer, group: str, topics: list[str], timeout_s: float) -> dict[str, int]:
    """topic -> messages of ``topics`` the group has not committed (broker watermarks)."""
    parts = []
    for topic in topics:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        parts += [TopicPartition(topic, p) for p in meta.partitions]
    if not parts:
        return {}
    answer = while_coordinator_loads(lambda left: admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, parts)])[group].result(timeout=left), timeout_s)
    lag: dict[str, int] = defaultdict(int)
    for tp in answer.topic_partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=timeout_s)
        lag[tp.topic] += max(0, high - (tp.offset if tp.offset >= 0 else low))
    return dict(lag)


def throughput(telemetry: list[dict[str, Any]], phase_of: dict[str, str], now: float,
               window_s: float) -> dict[tuple[str, str], dict[str, float]]:
    """(pool, phase) -> tokens/s, batches, errors of the telemetry finished in the window."""
    sums: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: {"tokens": 0, "batches": 0, "errors": 0})
    for t in telemetry:
        if t["phase"] not in ("PREFILL", "DECODE", "COLOCATED") or not now - window_s < _epoch_s(t["at"]) <= now:
            continue
        s = sums[(t["pool"], phase_of.get(t["worker_id"], TELEMETRY_PHASE[t["phase"]]))]
        if t["status"] == "OK":
            s["tokens"] += t["tokens_in"] if t["phase"] == "PREFILL" else t["tokens_out"]
            s["batches"] += 1
        else:
            s["errors"] += 1
    return {k: {"tokens_per_s": v["tokens"] / window_s, "batches": int(v["batches"]), "errors": int(v["errors"])}
            for k, v in sums.items()}


class PoolState(enum.Enum):
    """What a row of the report says about a pool's phase."""

    ALIVE = "alive"  # a worker's latest heartbeat in the window says UP and is fresh
    DEAD = "dead"  # heartbeats in the window (or `up` started it), none fresh and UP now
    STARTING = "starting"  # `up` started its workers, which have not sent a heartbeat yet
    HISTORY = "history"  # only topics or consumer groups remember it (shown with --all)


def collect(src: Sources, now: float, window_s: float = 60.0, only: list[str] | None = None, *,
            history: bool = False, recorded: Sequence[Any] = (), running: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """One report per (pool, phase) that runs now, sorted: pools with heartbeats in the window
    and pools ``recorded`` by ``up`` (``PoolSpec``s; ``running`` names the live processes of the
    run dir); ``history`` adds the pools only topics and consumer groups remember. Phases are
    those the workers (or the spec) run, never a placeholder. ``only`` keeps the named pools."""
    admin = AdminClient(with_cluster_config({"bootstrap.servers": src.bootstrap, "log_level": 4}))
    consumer = Consumer(with_cluster_config({
        "log_level": 4, "bootstrap.servers": src.bootstrap,
        "group.id": f"phaseroute.pools-report.{os.getpid()}.{uuid.uuid4().hex[:6]}",
        "enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "latest",
    }))
    try:
        workers = worker_states(read_since(consumer, src.heartbeat_topic, now - window_s, "pool_heartbeat", src.timeout_s), now)
        telemetry = read_since(consumer, src.telemetry_topic, now - window_s, "phase_telemetry", src.timeout_s)
        topic_names = set(admin.list_topics(timeout=src.timeout_s).topics)
        groups = [g.group_id for g in admin.list_consumer_groups().result(timeout=src.timeout_s).valid] if history else []
        keys = rows_to_show(workers, recorded, running or {}, groups, topic_names if history else set())
        rates = throughput(telemetry, {w: s["phase"] for w, s in workers.items()}, now, window_s)
        reports = []
        for (pool, phase), state in sorted(keys.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")):
            if only and pool not in only:
                continue
            topics = [f"{t}.{pool}" for t in PHASE_TOPICS.get(phase or "both", ()) if f"{t}.{pool}" in topic_names]
            group = f"phaseroute.{phase}.{pool}" if phase else None
            lag = group_lag(admin, consumer, group, topics, src.timeout_s) if group else {}
            mine = sorted((w for w in workers.values() if (w["pool"], w["phase"]) == (pool, phase)), key=lambda w: w["worker_id"])
            rate = rates.get((pool, phase or ""), {"tokens_per_s": 0.0, "batches": 0, "errors": 0})
            alive = sum(w["alive"] for w in mine)
            reports.append({
                "pool": pool, "phase": phase, "state": state.value, "alive": alive > 0, "workers_alive": alive,
                "workers": mine, "group": group, "lag": sum(lag.values()) if topics and group else None,
                "lag_by_topic": lag, **rate,
            })
        return reports
    finally:
        consumer.close()


def rows_to_show(workers: Mapping[str, Mapping[str, Any]], recorded: Sequence[Any], running: Mapping[str, int],
                 groups: Sequence[str], topic_names: set[str]) -> dict[tuple[str, str | None], PoolState]:
    """(pool, phase) -> state of every row: heartbeats first, then what `up` recorded, then
    (given groups and topic names) the history. A history pool no group names has one row
    without a phase (its topics alone do not say which phases it ran)."""
    rows: dict[tuple[str, str | None], PoolState] = {}
    for w in workers.values():
        key = (w["pool"], w["phase"])
        if w["alive"] or key not in rows:
            rows[key] = PoolState.ALIVE if w["alive"] else PoolState.DEAD
    for spec in recorded:
        key = (spec.name, spec.phase)
        if key not in rows:
            starting = any(n.startswith(f"worker-{spec.name}-") for n in running)
            rows[key] = PoolState.STARTING if starting else PoolState.DEAD
    current = {pool for pool, _ in rows}
    for g in groups:
        m = GROUP.match(g)
        if m and POOL_NAME.match(m.group(2)) and m.group(2) not in current:
            rows[(m.group(2), m.group(1))] = PoolState.HISTORY
    remembered = {pool for pool, _ in rows}
    for name in topic_names:
        kind, _, pool = name.partition(".")
        if kind in ("prefill", "decode") and POOL_NAME.match(pool) and pool not in remembered:
            rows[(pool, None)] = PoolState.HISTORY
    return rows


def _control(bootstrap: str, timeout_s: float = 10.0) -> dict[str, Any]:
    admin = AdminClient(with_cluster_config({"bootstrap.servers": bootstrap, "log_level": 4}))
    consumer = Consumer(with_cluster_config({"bootstrap.servers": bootstrap, "log_level": 4,
                                             "group.id": f"phaseroute.control-report.{os.getpid()}"}))
    try:
        return control_status.control_report(admin, consumer, bootstrap, timeout_s)
    finally:
        consumer.close()


def pools(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    only: list[str] = typer.Option([], "--pool", help="Only this pool (repeatable)."),
    window_s: float = typer.Option(60.0, "--window-s", min=1.0, help="Heartbeats and throughput of the last N seconds."),
    show_all: bool = typer.Option(False, "--all", help="Also pools of earlier stacks that only topics and consumer groups remember."),
    heartbeat_topic: str = typer.Option(POOLS_HEARTBEAT, "--heartbeat-topic", hidden=True),
    telemetry_topic: str = typer.Option(TELEMETRY_TOPIC, "--telemetry-topic", hidden=True),
) -> None:
    """The pools that run now, per phase: workers alive (heartbeats), consumer lag (committed offsets
    vs watermarks), tokens/s; `--all` adds the history. First, the control-plane instances: which
    one is active (holds the control lease), its partitions and lag, and the standbys."""
    from phaseroute.infra import processes, stack

    cfg = current_settings()
    now = time.time()
    with errors_as_messages(KafkaException), json_stdout(as_json, indent=2) as emit:
        reports = collect(Sources(cfg.bootstrap_servers, heartbeat_topic, telemetry_topic), now, window_s, only or None,
                          history=show_all, recorded=stack.recorded_pools(cfg.run_dir), running=processes.running(cfg.run_dir))
        control = _control(cfg.bootstrap_servers)
        if as_json:
            emit({"at": now, "window_s": window_s, "pools": reports, "control": control})
            return
    console.print(control_status.describe(control), highlight=False, markup=False)
    if not reports:
        console.print("no pool runs now" + ("" if show_all else " (`--all` also shows the pools of earlier stacks)"))
        return
    from rich.table import Table

    table = Table("pool", "phase", "state", "workers", "lag", "tokens/s", "batches", "errors")
    colour = {"alive": "green", "dead": "red", "starting": "yellow", "history": "dim"}
    for r in reports:
        lag = "-" if r["lag"] is None else str(r["lag"])
        table.add_row(r["pool"], r["phase"] or "-", f"[{colour[r['state']]}]{r['state']}[/]",
                      f"{r['workers_alive']}/{len(r['workers'])}", lag,
                      f"{r['tokens_per_s']:.1f}", str(r["batches"]), str(r["errors"]))
    print_table(table)
