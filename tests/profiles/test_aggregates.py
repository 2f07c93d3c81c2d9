"""Telemetry rows in embedded chdb -> PhaseAggregate / LinkAggregate, checked by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from phaseroute.streams.policy import Phase
from phaseroute.streams.profiles import aggregates_sql as sql

TAU = 300.0


def _by_bucket(measured: list[sql.Measured]) -> dict[tuple[str, str, int], sql.Measured]:
    return {(m.aggregate.pool, m.aggregate.phase.slug, m.aggregate.batch_size): m for m in measured}


def test_decayed_throughput_buckets_errors_and_replays(chdb: Any, db: str, tel: SimpleNamespace) -> None:
    r = tel.row
    rows = [
        # decode, bucket 8-15: 80 tok/s now, 40 tok/s 300 s ago (weight 1/e), one failure
        r("d1", "a", "DECODE", 0, batch_size=8, tokens_out=80, exec_time_s=1.0, steps=10, step_latency_s=0.1, step_latency_s_max=0.12),
        r("d2", "a", "DECODE", TAU, batch_size=8, tokens_out=80, exec_time_s=2.0, steps=10, step_latency_s=0.2, step_latency_s_max=0.25),
        r("d3", "a", "DECODE", 10, batch_size=9, status="ERROR", error_class="OutOfMemoryError", exec_time_s=0.0),
        r("d9", "a", "DECODE", 1000, batch_size=8, tokens_out=999, exec_time_s=1.0),  # older than the window
        # decode, bucket 1
        r("d4", "a", "DECODE", 0, batch_size=1, tokens_out=20, exec_time_s=1.0, steps=20, step_latency_s=0.05, step_latency_s_max=0.05),
        # prefill, bucket 4-7, KV measured: 40,000 bytes for 400 prompt tokens
        r("p1", "a", "PREFILL", 60, batch_size=4, tokens_in=400, tokens_out=4, exec_time_s=0.5, step_latency_s=0.5,
          step_latency_s_max=0.5, kv_bytes=40_000),
        r("c1", "a", "COLOCATED", 0, batch_size=4, tokens_in=400, exec_time_s=0.5),  # not a policy phase
    ]
    tel.insert(chdb, db, rows + [rows[0], rows[4]])  # the sink replayed two batches
    got = _by_bucket(sql.phase_aggregates(chdb, db, sql.Window(tel.NOW, 900.0, TAU)))
    assert set(got) == {("a", "decode", 8), ("a", "decode", 1), ("a", "prefill", 4)}

    big = got[("a", "decode", 8)].aggregate
    w = math.exp(-1.0)
    assert (big.samples, big.errors) == (3, 1)
    assert big.tokens_per_s == pytest.approx((80 * 1 + 40 * w) / (1 + w), rel=1e-9)
    assert big.last_seen == pytest.approx(tel.NOW)
    assert 0.1 - 1e-6 <= big.step_p50_s <= big.step_p90_s <= big.step_p99_s <= 0.25 + 1e-6
    assert got[("a", "decode", 8)].kv_bytes_per_token is None  # nobody reported KV bytes

    one = got[("a", "decode", 1)].aggregate
    assert (one.samples, one.errors, one.tokens_per_s) == (1, 0, pytest.approx(20.0))
    assert one.step_p50_s == pytest.approx(0.05, rel=1e-6)

    pre = got[("a", "prefill", 4)]
    assert pre.aggregate.phase is Phase.PREFILL
    assert (pre.aggregate.samples, pre.aggregate.tokens_per_s) == (1, pytest.approx(800.0))
    assert pre.aggregate.last_seen == pytest.approx(tel.NOW - 60)
    assert pre.kv_bytes_per_token == pytest.approx(100.0)


def test_bucket_point_sits_at_the_decayed_mean_batch(chdb: Any, db: str, tel: SimpleNamespace) -> None:
    rows = [
        tel.row("x1", "a", "DECODE", 0, batch_size=4, tokens_out=40, exec_time_s=1.0),
        tel.row("x2", "a", "DECODE", 0, batch_size=7, tokens_out=70, exec_time_s=1.0),
        tel.row("x3", "a", "DECODE", TAU * math.log(2), batch_size=6, tokens_out=60, exec_time_s=1.0),  # weight 1/2
    ]
    tel.insert(chdb, db, rows)
    [m] = sql.phase_aggregates(chdb, db, sql.Window(tel.NOW, 900.0, TAU))
    assert m.aggregate.batch_size == round((4 + 7 + 0.5 * 6) / 2.5)  # 5.6 -> 6
    assert m.aggregate.tokens_per_s == pytest.approx((40 + 70 + 0.5 * 60) / 2.5)


def test_links_bandwidth_and_fixed_cost(chdb: Any, db: str, tel: SimpleNamespace) -> None:
    # 6 transfers a -> b of 1..6 MB at 100 MB/s plus 10 ms each; one failed, one other link
    rows = [
        tel.row(f"t{k}", "b", "TRANSFER", k, source_pool="a", tokens_in=100 * k, kv_bytes=1_000_000 * k,
                kv_transfer_s=0.01 + k / 100, exec_time_s=0.01 + k / 100)
        for k in range(1, 7)
    ]
    rows.append(tel.row("tx", "b", "TRANSFER", 1, source_pool="a", kv_bytes=5, status="ERROR", exec_time_s=0.0))
    rows.append(tel.row("ty", "a", "TRANSFER", 1, source_pool="c", tokens_in=10, kv_bytes=2_000, kv_transfer_s=0.5))
    tel.insert(chdb, db, rows)
    window = sql.Window(tel.NOW, 900.0, TAU)
    links = {(link.src, link.dst): link for link in sql.link_aggregates(chdb, db, window)}
    ab = links[("a", "b")]
    assert ab.samples == 6
    assert ab.latency_s == pytest.approx(0.01, rel=1e-6)
    weights = [math.exp(-k / TAU) for k in range(1, 7)]
    mean_bytes = sum(w * 1e6 * k for w, k in zip(weights, range(1, 7))) / sum(weights)
    assert ab.bytes == pytest.approx(6 * mean_bytes)
    moving = ab.seconds - ab.samples * ab.latency_s
    assert ab.bytes / moving == pytest.approx(1e8, rel=1e-6)
    assert links[("c", "a")].latency_s == 0.0  # one transfer: no fixed cost can be fitted
    kv = sql.source_kv_per_token(chdb, db, window)
    assert kv == {("m", "a"): pytest.approx(10_000.0), ("m", "c"): pytest.approx(200.0)}


def test_nothing_in_the_window_gives_nothing(chdb: Any, db: str, tel: SimpleNamespace) -> None:
    tel.insert(chdb, db, [tel.row("old", "a", "DECODE", 901, tokens_out=5)])
    window = sql.Window(tel.NOW, 900.0, TAU)
    assert sql.phase_aggregates(chdb, db, window) == []
    assert sql.link_aggregates(chdb, db, window) == []


def test_bad_names_and_windows_are_refused() -> None:
    with pytest.raises(ValueError, match="database name"):
        sql.phase_sql("x; DROP TABLE y", sql.Window(0.0))
    with pytest.raises(ValueError, match="tau_s"):
        sql.Window(0.0, 900.0, 0.0)


def test_a_bucket_of_failures_only_becomes_an_unattractive_row(chdb: Any, db: str, tel: SimpleNamespace) -> None:
    from phaseroute.streams.policy import build_profile_rows

    tel.insert(chdb, db, [tel.row(f"e{i}", "bad", "DECODE", i, batch_size=8, status="ERROR", exec_time_s=0.0) for i in range(3)])
    [m] = sql.phase_aggregates(chdb, db, sql.Window(tel.NOW, 900.0, TAU))
    assert (m.aggregate.samples, m.aggregate.errors, m.aggregate.tokens_per_s, m.aggregate.batch_size) == (3, 3, 0.0, 8)
    assert (m.aggregate.step_p50_s, m.aggregate.step_p99_s) == (0.0, 0.0)
    [row] = build_profile_rows([m.aggregate], tel.NOW)
    assert row.error_rate == 1.0 and row.tokens_per_s(8) < 1e-3
