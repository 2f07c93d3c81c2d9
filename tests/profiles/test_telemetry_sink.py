"""The telemetry sink inserts buffered records per kind in one batch each, counts what that cost,
and tells the loop when its batch is due (so the loop's poll waits instead of spinning)."""

from __future__ import annotations

from typing import Any

import pytest

from phaseroute.consumers.handler import WorkItem
from phaseroute.consumers.telemetry_records import WorkerTag, telemetry_output
from phaseroute.consumers.telemetry_sink import TelemetrySinkHandler
from phaseroute.schemas.examples import example


def _items(n: int, start: int = 0) -> list[WorkItem]:
    tag = WorkerTag("colo", "colo-0", "smollm2-135m", "fp32")
    items = [WorkItem(("telemetry.phase", 0), start + i, "phase_telemetry",
                      telemetry_output(tag, f"colo-0/{start + i}", "DECODE", batch_size=4, tokens_out=64).record, 0.0, 0.0)
             for i in range(n)]
    beat = dict(example("pool_heartbeat"), worker_id="colo-0")
    return [*items, WorkItem(("pools.heartbeat", 0), start, "pool_heartbeat", beat, 0.0, 0.0)]


def test_one_insert_per_kind_and_the_cost_is_counted(chdb: Any, db: str) -> None:
    sink = TelemetrySinkHandler(chdb, db, flush_interval_s=1.0, max_rows=5_000)
    assert sink.admit(_items(300)) == [] and sink.in_flight() == 301
    assert not sink.batch_ready(sink._first_at) and sink.due_in(sink._first_at + 0.05) == pytest.approx(0.95)
    assert sink.batch_ready(sink._first_at + 1.0) and sink.due_in(sink._first_at + 5.0) == 0.0
    done = sink.step()
    assert len(done) == 301 and sink.in_flight() == 0
    assert sink.inserted["phase_telemetry"] == 300 and sink.inserted["pool_heartbeat"] == 1
    assert (sink.cost.records, sink.cost.batches) == (301, 1) and sink.cost.wall_s > 0
    sink.admit(_items(50, start=300))
    sink.step()
    assert sink.cost.batches == 2 and sink.cost.records == 352
    assert chdb.query(f"SELECT count() FROM {db}.phase_telemetry").result_rows[0][0] == 350


def test_a_replayed_batch_is_counted_once_by_batch_id(chdb: Any, db: str) -> None:
    sink = TelemetrySinkHandler(chdb, db)
    for _ in range(2):  # a crash before the commit: the same records come again
        sink.admit(_items(10))
        sink.step()
    assert chdb.query(f"SELECT count(DISTINCT batch_id) FROM {db}.phase_telemetry").result_rows[0][0] == 10
