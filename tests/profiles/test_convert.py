"""Policy rows and links <-> profile_row Avro; cold-start engine_profile grids -> PROFILER rows."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from phaseroute.engine.profiler import COLUMNS as PROFILE_COLUMNS
from phaseroute.engine.profiler import TABLE as PROFILE_TABLE
from phaseroute.infra.clickhouse import insert_rows
from phaseroute.schemas import serde
from phaseroute.streams.policy import CurvePoint, LinkProfile, Phase, ProfileRow, ProfileSource
from phaseroute.streams.profiles import aggregates_sql as sql
from phaseroute.streams.profiles.convert import (
    from_avro,
    link_to_avro,
    profiler_rows,
    record_key,
    row_to_avro,
    table_from_avro,
)


def _row(**kw: Any) -> ProfileRow:
    base = dict(
        model="m", phase=Phase.DECODE, pool="a", variant="fp32", curve=(CurvePoint(1, 20.0), CurvePoint(8, 120.0)),
        step_p50_s=0.05, step_p90_s=0.06, step_p99_s=0.09, mem_bytes_per_token=46_080.0, kv_bytes_per_token=46_080.0,
        error_rate=0.25, quality_score=0.97, samples=40, updated_at=1_800_000_000.125, source=ProfileSource.TELEMETRY,
    )
    return ProfileRow(**{**base, **kw})


def _through_avro(record: dict[str, Any]) -> dict[str, Any]:
    return serde.decode(serde.encode("profile_row", record), "profile_row")[1]


def test_row_round_trip() -> None:
    row = _row()
    record = _through_avro(row_to_avro(row, 900.0))
    assert (record["phase"], record["source"], record["tokens_per_s"], record["window_s"]) == ("DECODE", "TELEMETRY", 120.0, 900.0)
    assert record["updated_at"] == 1_800_000_000_125
    assert from_avro(record) == row
    assert record_key(record) == "m|DECODE|a|fp32|telemetry"


def test_unmeasured_quality_is_null_and_reads_as_the_default() -> None:
    record = _through_avro(row_to_avro(_row(quality_score=1.0), 900.0, quality_measured=False))
    assert record["quality_score"] is None
    assert from_avro(record, default_quality_score=0.9).quality_score == 0.9


def test_link_round_trip_and_table() -> None:
    link = LinkProfile("a", "b", 1e8, 0.01, 6, 1_800_000_000.0)
    record = _through_avro(link_to_avro(link, 900.0))
    assert (record["phase"], record["pool"], record["source_pool"]) == ("TRANSFER", "b", "a")
    assert record_key(record) == "*|TRANSFER|b|*|a"
    assert from_avro(record) == link
    prof = _row(source=ProfileSource.PROFILER, samples=8)
    table = table_from_avro([_through_avro(row_to_avro(r, 900.0)) for r in (_row(), prof)] + [record])
    assert set(table.rows_for("m", Phase.DECODE, "a", "fp32")) == {ProfileSource.TELEMETRY, ProfileSource.PROFILER}
    assert table.link("a", "b") == link


def _grid(run_id: str, at: Any, scale: float = 1.0) -> list[dict[str, Any]]:
    base = {"run_id": run_id, "pool": "cpu", "model": "m", "variant": "fp32", "backend": "torch", "device": "cpu",
            "dtype": "float32", "quantization": "none", "threads": 2, "host": "h", "kv_bytes_per_token": 46_080,
            "peak_rss_bytes": 10**9, "at": at}
    cells = []
    for batch, step_s in ((1, 0.05), (8, 0.1)):
        for ctx, slow in ((64, 1.0), (256, 1.5)):
            latency = step_s * slow * scale
            cells.append({**base, "phase": "DECODE", "batch_size": batch, "seq_len": ctx, "samples": 4,
                          "latency_s": latency, "latency_p50_s": latency * 0.9, "tokens_per_s": batch / latency,
                          "memory_bytes_per_token": 50_000.0})
    for batch in (1, 4):
        latency = 0.2 * batch * scale
        cells.append({**base, "phase": "PREFILL", "batch_size": batch, "seq_len": 128, "samples": 1,
                      "latency_s": latency, "latency_p50_s": latency, "tokens_per_s": batch * 128 / latency,
                      "memory_bytes_per_token": 60_000.0})
    return cells


def test_cold_start_rows_from_the_newest_profile_run(chdb: Any, db: str, ts: Any) -> None:
    old, new = _grid("run-old", ts(3600), scale=10.0), _grid("run-new", ts(60))
    insert_rows(chdb, f"{db}.{PROFILE_TABLE}", old + new, PROFILE_COLUMNS)
    grid = sql.latest_profile_runs(chdb, db)
    assert sql.run_ids(grid) == {("m", "cpu", "fp32"): "run-new"}
    rows = {r.phase: r for r in profiler_rows(grid, now=1_800_000_000.0)}
    decode, prefill = rows[Phase.DECODE], rows[Phase.PREFILL]
    assert {r.source for r in rows.values()} == {ProfileSource.PROFILER}
    assert [p.batch_size for p in decode.curve] == [1, 8]
    assert decode.tokens_per_s(1) == pytest.approx((1 / 0.05 + 1 / 0.075) / 2)  # mean over the contexts
    assert decode.tokens_per_s(8) == pytest.approx((8 / 0.1 + 8 / 0.15) / 2)
    assert decode.step_p99_s == pytest.approx(0.15) and decode.step_p50_s < decode.step_p99_s
    assert (decode.kv_bytes_per_token, decode.mem_bytes_per_token) == (46_080, pytest.approx(50_000.0))
    assert decode.samples == 16 and decode.updated_at == pytest.approx(1_800_000_000.0 - 60)
    assert prefill.tokens_per_s(4) == pytest.approx(4 * 128 / 0.8)
    again = from_avro(_through_avro(row_to_avro(decode, 0.0)))
    assert replace(again, quality_score=decode.quality_score) == decode
