"""``phaseroute pools``: per pool and phase, the workers alive, consumer lag and recent throughput.

Everything comes from Kafka, so it works while the telemetry service owns the embedded chdb:

* workers: the latest ``pools.heartbeat`` record of each worker since ``now - window_s``
  (read from the offsets of that time); a worker is alive when its latest heartbeat says UP
  and is at most ``MISSED_BEATS`` of its intervals old. A pool whose heartbeats stopped shows
  with no live workers (dead), because its work topics still name it.
* lag: committed offsets of the group ``phaseroute.<phase>.<pool>`` against the high
  watermarks of ``prefill.<pool>`` / ``decode.<pool>`` (both for colocated workers); a
  partition the group never committed counts everything retained on it.
* throughput: prompt tokens (PREFILL) and generated tokens (DECODE) of the OK batches in
  ``telemetry.phase`` finished within the window, per second of the window.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import typer
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from phaseroute.cli.common import console, current_settings, errors_as_messages
from phaseroute.infra.topics import POOL_NAME
from phaseroute.schemas import serde

HEARTBEAT_TOPIC = "pools.heartbeat"
TELEMETRY_TOPIC = "telemetry.phase"
MISSED_BEATS = 3
GROUP = re.compile(r"^phaseroute\.(prefill|decode|both)\.(.+)$")
PHASE_TOPICS = {"prefill": ("prefill",), "decode": ("decode",), "both": ("prefill", "decode")}
TELEMETRY_PHASE = {"PREFILL": "prefill", "DECODE": "decode", "COLOCATED": "both"}


@dataclass(frozen=True)
class Sources:
    """Where to read (tests and prefixed deployments use their own topics)."""

    bootstrap: str
    heartbeat_topic: str = HEARTBEAT_TOPIC
    telemetry_topic: str = TELEMETRY_TOPIC
    timeout_s: float = 10.0


def _epoch_s(value: Any) -> float:
    return value.timestamp() if hasattr(value, "timestamp") else value / 1000.0


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
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                continue
            try:
                records.append(serde.decode(msg.value(), kind)[1])
            except Exception:  # noqa: BLE001 - someone else's bad record is not this report's problem
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
    answer = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group, parts)])[group].result(timeout=timeout_s)
    lag: dict[str, int] = defaultdict(int)
    for tp in answer.topic_partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(tp.topic, tp.partition), timeout=timeout_s)
        lag[tp.topic] += max(0, high - (tp.offset if tp.offset >= 0 else low))
    return dict(lag)


def throughput(telemetry: list[dict[str, Any]], phase_of: dict[str, str], now: float, window_s: float) -> dict:
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


def collect(src: Sources, now: float, window_s: float = 60.0, only: list[str] | None = None) -> list[dict[str, Any]]:
    """One report per (pool, phase), sorted; ``only`` keeps the named pools."""
    admin = AdminClient({"bootstrap.servers": src.bootstrap})
    consumer = Consumer({
        "bootstrap.servers": src.bootstrap, "group.id": f"phaseroute.pools-report.{os.getpid()}.{uuid.uuid4().hex[:6]}",
        "enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "latest",
    })
    try:
        workers = worker_states(read_since(consumer, src.heartbeat_topic, now - window_s, "pool_heartbeat", src.timeout_s), now)
        telemetry = read_since(consumer, src.telemetry_topic, now - window_s, "phase_telemetry", src.timeout_s)
        topic_names = set(admin.list_topics(timeout=src.timeout_s).topics)
        groups = [g.group_id for g in admin.list_consumer_groups().result(timeout=src.timeout_s).valid]
        keys = _pool_phases(topic_names, groups, workers, only)
        rates = throughput(telemetry, {w: s["phase"] for w, s in workers.items()}, now, window_s)
        reports = []
        for pool, phase in sorted(keys):
            topics = [f"{t}.{pool}" for t in PHASE_TOPICS[phase] if f"{t}.{pool}" in topic_names]
            group = f"phaseroute.{phase}.{pool}"
            lag = group_lag(admin, consumer, group, topics, src.timeout_s)
            mine = sorted((w for w in workers.values() if (w["pool"], w["phase"]) == (pool, phase)), key=lambda w: w["worker_id"])
            rate = rates.get((pool, phase), {"tokens_per_s": 0.0, "batches": 0, "errors": 0})
            alive = sum(w["alive"] for w in mine)
            reports.append({
                "pool": pool, "phase": phase, "alive": alive > 0, "workers_alive": alive, "workers": mine,
                "group": group, "lag": sum(lag.values()) if topics else None, "lag_by_topic": lag, **rate,
            })
        return reports
    finally:
        consumer.close()


def _pool_phases(topic_names: set[str], groups: list[str], workers: dict, only: list[str] | None) -> set[tuple[str, str]]:
    phases: dict[str, set[str]] = defaultdict(set)
    for w in workers.values():
        phases[w["pool"]].add(w["phase"])
    for g in groups:
        m = GROUP.match(g)
        if m and POOL_NAME.match(m.group(2)):
            phases[m.group(2)].add(m.group(1))
    for name in topic_names:
        kind, _, pool = name.partition(".")
        if kind in ("prefill", "decode") and POOL_NAME.match(pool):
            phases.setdefault(pool, set())
    keys = set()
    for pool, seen in phases.items():
        if only and pool not in only:
            continue
        seen = seen or {k for k in ("prefill", "decode") if f"{k}.{pool}" in topic_names}
        keys |= {(pool, phase) for phase in seen if phase in PHASE_TOPICS}
    return keys


def pools(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    only: list[str] = typer.Option([], "--pool", help="Only this pool (repeatable)."),
    window_s: float = typer.Option(60.0, "--window-s", min=1.0, help="Heartbeats and throughput of the last N seconds."),
    heartbeat_topic: str = typer.Option(HEARTBEAT_TOPIC, "--heartbeat-topic", hidden=True),
    telemetry_topic: str = typer.Option(TELEMETRY_TOPIC, "--telemetry-topic", hidden=True),
) -> None:
    """Per pool and phase: workers alive (heartbeats), consumer lag (committed offsets vs watermarks), tokens/s."""
    cfg = current_settings()
    now = time.time()
    with errors_as_messages(KafkaException):
        reports = collect(Sources(cfg.bootstrap_servers, heartbeat_topic, telemetry_topic), now, window_s, only or None)
    if as_json:
        print(json.dumps({"at": now, "window_s": window_s, "pools": reports}, indent=2))
        return
    from rich.table import Table

    table = Table("pool", "phase", "state", "workers", "lag", "tokens/s", "batches", "errors")
    for r in reports:
        state = "[green]alive[/]" if r["alive"] else "[red]dead[/]"
        lag = "-" if r["lag"] is None else str(r["lag"])
        table.add_row(r["pool"], r["phase"], state, f"{r['workers_alive']}/{len(r['workers'])}", lag,
                      f"{r['tokens_per_s']:.1f}", str(r["batches"]), str(r["errors"]))
    console.print(table)
