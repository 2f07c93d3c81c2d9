"""Recent telemetry in ClickHouse -> the policy's ``PhaseAggregate`` and ``LinkAggregate``.

Only gathering happens here; the profile math (curves, blending, bandwidth) is the policy's.

Window and decay: rows with ``at`` in the last ``window_s`` before ``now`` count, each with
weight ``exp(-age / tau_s)`` (``age = max(0, now - at)``). Throughput is the weighted mean of
the per-batch throughput of the OK batches (PREFILL ``tokens_in / exec_time_s``, DECODE
``tokens_out / exec_time_s``). ``samples`` and ``errors`` are plain counts. Every batch counts
once however often the sink replayed it (``LIMIT 1 BY batch_id``).

Buckets are powers of two of ``batch_size`` (1, 2-3, 4-7, 8-15, ...), as in the simulator;
a bucket's curve point sits at its decayed mean batch size, rounded.

Step latency: p50 and p90 are t-digest quantiles of the batches' mean step latency; p99 is
the larger of their 0.99 quantile and the median of the batches' slowest step (a decode window
of n steps has its max near the step latency's 1 - 1/n quantile). KV bytes per token is
measured where a batch reports KV bytes (PREFILL: per prompt token; DECODE: per context
token); ``None`` where no batch did. TRANSFER rows measure links and, per (model, source
pool), the KV a prefill on that pool writes per prompt token.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from phaseroute.streams.policy import LinkAggregate, Phase, PhaseAggregate

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Window:
    """Which telemetry counts, and how fast its weight decays."""

    now: float  # seconds since the epoch; the end of the window
    window_s: float = 900.0
    tau_s: float = 60.0  # see BuilderConfig.tau_s

    def __post_init__(self) -> None:
        for name in ("now", "window_s", "tau_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or (name != "now" and value <= 0):
                raise ValueError(f"Window.{name} must be a finite{' positive' if name != 'now' else ''} number, got {value!r}")


@dataclass(frozen=True)
class Measured:
    """One bucket's aggregate plus the KV figure that SQL may not have measured."""

    aggregate: PhaseAggregate
    kv_bytes_per_token: float | None  # None: no batch of the bucket reported KV bytes


def check_database(database: str) -> str:
    if not IDENTIFIER.match(database):
        raise ValueError(f"ClickHouse database name {database!r} must match {IDENTIFIER.pattern}")
    return database


def _recent(database: str, w: Window, phases: str) -> str:
    """The window's telemetry rows of ``phases``, one per batch_id, with weight ``w``."""
    return f"""
        SELECT *, toUnixTimestamp64Milli(at) / 1000.0 AS at_s,
               exp(-greatest({w.now!r} - at_s, 0.0) / {w.tau_s!r}) AS w,
               status = 'OK' AND exec_time_s > 0 AS ok
        FROM {check_database(database)}.phase_telemetry
        WHERE at > toDateTime64({w.now - w.window_s!r}, 3, 'UTC') AND phase IN ({phases})
        LIMIT 1 BY batch_id"""


def phase_sql(database: str, w: Window) -> str:
    return f"""
    SELECT model, phase, pool, variant, toUInt32(if(batch_size <= 1, 0, floor(log2(batch_size)))) AS bucket,
           count() AS samples,
           countIf(status = 'ERROR') AS errors,
           if(sumIf(w, ok) > 0,
              sumIf(w * if(phase = 'PREFILL', tokens_in, tokens_out) / exec_time_s, ok) / sumIf(w, ok), 0.0) AS tokens_per_s,
           if(sumIf(w, ok) > 0, sumIf(w * batch_size, ok) / sumIf(w, ok), exp2(bucket)) AS batch_mean,
           quantilesTDigestIf(0.5, 0.9, 0.99)(step_latency_s, ok) AS q,
           quantileTDigestIf(0.5)(greatest(step_latency_s_max, step_latency_s), ok) AS max_median,
           sumIf(kv_bytes, kv_bytes > 0) AS kv_bytes_sum,
           sumIf(if(phase = 'PREFILL', toFloat64(tokens_in), seq_len_mean * batch_size), kv_bytes > 0) AS kv_tokens_sum,
           max(at_s) AS last_seen
    FROM ({_recent(database, w, "'PREFILL', 'DECODE'")})
    GROUP BY model, phase, pool, variant, bucket
    ORDER BY model, phase, pool, variant, bucket"""


def link_sql(database: str, w: Window) -> str:
    return f"""
    SELECT source_pool AS src, pool AS dst, count() AS samples,
           sum(w * kv_bytes) / sum(w) AS mean_bytes, sum(w * kv_transfer_s) / sum(w) AS mean_s,
           min(kv_transfer_s) AS min_s, stddevPop(toFloat64(kv_bytes)) / avg(kv_bytes) AS bytes_cv,
           simpleLinearRegression(toFloat64(kv_bytes), kv_transfer_s) AS fit,
           max(at_s) AS last_seen
    FROM ({_recent(database, w, "'TRANSFER'")})
    WHERE ok AND source_pool IS NOT NULL AND kv_bytes > 0 AND kv_transfer_s > 0
    GROUP BY src, dst
    ORDER BY src, dst"""


def source_kv_sql(database: str, w: Window) -> str:
    """KV bytes a prefill on each pool writes per prompt token, from the transfers of its KV."""
    return f"""
    SELECT model, source_pool AS pool, sum(kv_bytes) / sum(tokens_in) AS kv_bytes_per_token
    FROM ({_recent(database, w, "'TRANSFER'")})
    WHERE ok AND source_pool IS NOT NULL AND kv_bytes > 0 AND tokens_in > 0
    GROUP BY model, pool"""


def _rows(client: Any, sql: str) -> list[dict[str, Any]]:
    result = client.query(sql)
    return [dict(zip(result.column_names, row)) for row in result.result_rows]


def _measured(r: dict[str, Any]) -> Measured:
    p50, p90, p99 = (float(x) if math.isfinite(x) else 0.0 for x in r["q"])
    p99 = max(p99, float(r["max_median"]) if math.isfinite(r["max_median"]) else 0.0)
    aggregate = PhaseAggregate(
        model=r["model"], phase=Phase(r["phase"]), pool=r["pool"], variant=r["variant"],
        batch_size=max(1, round(r["batch_mean"])), samples=int(r["samples"]), tokens_per_s=float(r["tokens_per_s"]),
        step_p50_s=p50, step_p90_s=max(p50, p90), step_p99_s=max(p50, p90, p99), errors=int(r["errors"]),
        mem_bytes_per_token=0.0, kv_bytes_per_token=0.0, last_seen=float(r["last_seen"]),
    )
    kv = r["kv_bytes_sum"] / r["kv_tokens_sum"] if r["kv_bytes_sum"] > 0 and r["kv_tokens_sum"] > 0 else None
    return Measured(aggregate, kv)


def phase_aggregates(client: Any, database: str, window: Window) -> list[Measured]:
    """One ``Measured`` per (model, phase, pool, variant, batch bucket) with telemetry in the window."""
    return [_measured(r) for r in _rows(client, phase_sql(database, window))]


def fixed_cost_s(r: dict[str, Any], min_samples: int = 5, min_bytes_cv: float = 0.1) -> float:
    """Per-transfer fixed cost: the intercept of seconds over bytes, when sizes vary enough to
    fit it, clamped to [0, half the fastest transfer] (so bandwidth stays finite); else 0."""
    fit = r["fit"]
    k, b = (fit["k"], fit["b"]) if isinstance(fit, dict) else fit
    if r["samples"] < min_samples or not r["bytes_cv"] >= min_bytes_cv or not (math.isfinite(k) and k > 0):
        return 0.0
    return min(max(0.0, float(b)), 0.5 * float(r["min_s"]))


def link_aggregates(client: Any, database: str, window: Window) -> list[LinkAggregate]:
    """One ``LinkAggregate`` per (source pool, destination pool) with OK transfers in the window.
    ``bytes`` and ``seconds`` are ``samples`` times the decayed means (so they stay consistent
    with the sample count the policy subtracts fixed costs for)."""
    links = []
    for r in _rows(client, link_sql(database, window)):
        n = int(r["samples"])
        links.append(LinkAggregate(
            src=r["src"], dst=r["dst"], samples=n, bytes=n * float(r["mean_bytes"]), seconds=n * float(r["mean_s"]),
            last_seen=float(r["last_seen"]), latency_s=fixed_cost_s(r),
        ))
    return links


def source_kv_per_token(client: Any, database: str, window: Window) -> dict[tuple[str, str], float]:
    """(model, pool) -> KV bytes per prompt token of the KV that pool's prefills wrote."""
    return {(r["model"], r["pool"]): float(r["kv_bytes_per_token"]) for r in _rows(client, source_kv_sql(database, window))}


LATEST_PROFILE_SQL = """
    SELECT model, phase, pool, variant, run_id, batch_size, seq_len, samples, latency_s, latency_p50_s,
           tokens_per_s, kv_bytes_per_token, memory_bytes_per_token, toUnixTimestamp64Milli(at) / 1000.0 AS at
    FROM {db}.engine_profile
    WHERE (model, pool, variant, run_id) IN (
        SELECT model, pool, variant, argMax(run_id, at) FROM {db}.engine_profile GROUP BY model, pool, variant)
    ORDER BY model, pool, variant, phase, batch_size, seq_len"""


def latest_profile_runs(client: Any, database: str) -> list[dict[str, Any]]:
    """The grid rows of the newest profile run of each (model, pool, variant)."""
    return _rows(client, LATEST_PROFILE_SQL.format(db=check_database(database)))


def run_ids(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str, str], str]:
    return {(r["model"], r["pool"], r["variant"]): r["run_id"] for r in rows}
