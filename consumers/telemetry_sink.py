"""Telemetry sink: phase telemetry and heartbeats from Kafka into ClickHouse, in batches.

Life of a telemetry record: a worker emitted one ``phase_telemetry`` record per executed batch
(or a ``pool_heartbeat`` every few seconds). The sink gathers records for up to
``flush_interval_s`` or ``max_rows``, inserts them as one Arrow batch per table, and only then
lets the loop commit (the loop's poll waits for the flush instead of spinning while records
are buffered; each record costs one dict conversion, nothing that grows with the history:
``SinkCost`` counts records, batches and the seconds the inserts took). A crash redoes the uncommitted tail; ``phase_telemetry`` is a
ReplacingMergeTree keyed by batch_id, and readers count ``DISTINCT batch_id``, so a replay
never inflates the figures. The drift monitor's ``drift_measurement`` and ``quality_alert``
records (``telemetry.drift``, ``quality.alerts``) land in their tables the same way. In embedded
mode this process owns the chdb data path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from phaseroute.consumers.handler import Completion, Output, WorkItem
from phaseroute.consumers.offsets import TopicPartition
from phaseroute.infra.clickhouse import insert_rows

TELEMETRY_COLUMNS = [
    "batch_id", "pool", "worker_id", "model", "phase", "variant", "batch_size", "tokens_in", "tokens_out",
    "seq_len_mean", "seq_len_max", "queue_wait_s", "exec_time_s", "steps", "step_latency_s", "step_latency_s_max",
    "kv_bytes", "kv_transfer_s", "source_pool", "status", "error_class", "at",
]
HEARTBEAT_COLUMNS = [
    "pool", "worker_id", "phase", "variant", "queue_depth", "consumer_lag", "batch_in_flight", "max_batch",
    "memory_bytes", "kv_free_bytes", "status", "at",
]
DRIFT_COLUMNS = [
    "measurement_id", "model", "prefill_pool", "decode_pool", "colocated", "prefill_variant", "decode_variant",
    "canary_set", "round", "canaries_sent", "canaries_received", "positions", "greedy_agreement", "top1_agreement",
    "mean_kl", "max_kl", "first_divergence_mean", "first_divergence_min", "quality_score", "exact_ok", "state",
    "reason", "at",
]
ALERT_COLUMNS = [
    "alert_id", "model", "prefill_pool", "decode_pool", "colocated", "kind", "reason", "greedy_agreement",
    "top1_agreement", "mean_kl", "max_kl", "measurement_id", "at",
]
TABLES = {
    "phase_telemetry": ("phase_telemetry", TELEMETRY_COLUMNS), "pool_heartbeat": ("pool_heartbeat", HEARTBEAT_COLUMNS),
    "drift_measurement": ("drift_measurement", DRIFT_COLUMNS), "quality_alert": ("quality_alert", ALERT_COLUMNS),
}


@dataclass
class SinkCost:
    """What the inserts cost: records, batches, wall and CPU seconds (this process, all threads)."""

    records: int = 0
    batches: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0

    def add(self, records: int, wall_s: float, cpu_s: float) -> None:
        self.records += records
        self.batches += 1
        self.wall_s += wall_s
        self.cpu_s += cpu_s


class TelemetrySinkHandler:
    """Buffers telemetry records and inserts them into ClickHouse per batch."""

    def __init__(self, client: Any, database: str, flush_interval_s: float = 1.0, max_rows: int = 5_000) -> None:
        self.client = client
        self.database = database
        self.flush_interval_s = flush_interval_s
        self.max_rows = max_rows
        self._buffer: list[WorkItem] = []
        self._first_at: float | None = None
        self.inserted = {kind: 0 for kind in TABLES}
        self.cost = SinkCost()

    def capacity(self) -> int:
        return self.max_rows - len(self._buffer)

    def batch_ready(self, now: float) -> bool:
        if not self._buffer:
            return False
        return len(self._buffer) >= self.max_rows or now - (self._first_at or now) >= self.flush_interval_s

    def due_in(self, now: float) -> float:
        return max(0.0, self.flush_interval_s - (now - (self._first_at or now)))

    def admit(self, items: list[WorkItem]) -> list[Completion]:
        refused = [Completion(i, dead_letter_reason=f"no ClickHouse table for kind {i.kind!r}", error_class="UnknownKind")
                   for i in items if i.kind not in TABLES]
        accepted = [i for i in items if i.kind in TABLES]
        if accepted and not self._buffer:
            self._first_at = time.time()
        self._buffer.extend(accepted)
        return refused

    def step(self) -> list[Completion]:
        started, cpu = time.perf_counter(), time.process_time()
        batch, self._buffer, self._first_at = self._buffer, [], None
        by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in TABLES}
        for item in batch:
            by_kind[item.kind].append(_row(item.record))
        for kind, rows in by_kind.items():
            table, columns = TABLES[kind]
            self.inserted[kind] += insert_rows(self.client, f"{self.database}.{table}", rows, columns)
        self.cost.add(len(batch), time.perf_counter() - started, time.process_time() - cpu)
        return [Completion(i) for i in batch]

    def in_flight(self) -> int:
        return len(self._buffer)

    def drop(self, tps: list[TopicPartition]) -> int:
        before = len(self._buffer)
        self._buffer = [i for i in self._buffer if i.tp not in tps]
        return before - len(self._buffer)

    def telemetry(self) -> list[Output]:
        return []

    def status(self) -> dict[str, Any]:
        return {"batch_in_flight": len(self._buffer), "max_batch": self.max_rows, "memory_bytes": 0, "kv_free_bytes": 0}


TIMESTAMP_COLUMNS = frozenset({"at"})  # DateTime64(3, 'UTC') columns; the records carry epoch ms


def _row(record: dict[str, Any]) -> dict[str, Any]:
    """Enum values as their names, epoch-millisecond timestamps as UTC datetimes (an int would be
    read as seconds by the DateTime64 column); everything else as decoded."""
    row = {}
    for key, value in record.items():
        if key in TIMESTAMP_COLUMNS and isinstance(value, int):
            value = datetime.fromtimestamp(value / 1000, tz=UTC)
        elif hasattr(value, "name") and not isinstance(value, str):
            value = value.name
        row[key] = value
    return row
