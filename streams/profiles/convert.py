"""Policy profile rows and links <-> ``profile_row`` Avro records; cold-start grids -> PROFILER rows.

The ``profiles`` topic carries both kinds of record (schemas/avro/profile_row.avsc):

* a ``ProfileRow`` as ``phase`` PREFILL/DECODE, ``source`` as its source, ``batch_curve`` as
  its curve, ``tokens_per_s`` the curve's peak;
* a ``LinkProfile`` as ``phase`` TRANSFER, ``pool`` = destination, ``source_pool`` = source,
  ``transfer_bytes_per_s`` / ``transfer_latency_s`` set. Links are not per model or variant
  in the policy, so their ``model`` and ``variant`` are ``"*"``.

``updated_at`` is when the newest sample was taken (the router's confidence decays with its
age), in epoch milliseconds. A control plane reading the topic rebuilds its table with
``table_from_avro`` (or ``from_avro`` per record).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from statistics import fmean
from typing import Any

from phaseroute.schemas.ids import profile_key
from phaseroute.streams.policy import (
    CurvePoint,
    LinkProfile,
    Phase,
    PhaseAggregate,
    ProfileBuilderConfig,
    ProfileRow,
    ProfileSource,
    ProfileTable,
    build_profile_rows,
)

LINK_MODEL = "*"
LINK_VARIANT = "*"
TRANSFER = "TRANSFER"
NO_THROUGHPUT = 1e-6  # a curve point must be positive: what a row without a curve reads as


def epoch_s(value: Any) -> float:
    """Seconds since the epoch from a datetime (naive = UTC) or a number of seconds."""
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()
    return float(value)


def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def row_to_avro(row: ProfileRow, window_s: float, quality_measured: bool = True) -> dict[str, Any]:
    """The ``profile_row`` record of a policy row (``quality_score`` null unless measured)."""
    return {
        "model": row.model, "phase": row.phase.value, "pool": row.pool, "variant": row.variant,
        "source_pool": None, "source": row.source.value,
        "batch_curve": [{"batch_size": p.batch_size, "tokens_per_s": p.tokens_per_s} for p in row.curve],
        "step_latency_s_p50": row.step_p50_s, "step_latency_s_p90": row.step_p90_s,
        "step_latency_s_p99": row.step_p99_s, "tokens_per_s": max(p.tokens_per_s for p in row.curve),
        "mem_bytes_per_token": row.mem_bytes_per_token, "kv_bytes_per_token": row.kv_bytes_per_token,
        "transfer_bytes_per_s": None, "transfer_latency_s": None, "error_rate": row.error_rate,
        "quality_score": row.quality_score if quality_measured else None, "samples": row.samples,
        "window_s": float(window_s), "updated_at": _ms(row.updated_at),
    }


def link_to_avro(link: LinkProfile, window_s: float) -> dict[str, Any]:
    """The TRANSFER ``profile_row`` record of a measured link."""
    return {
        "model": LINK_MODEL, "phase": TRANSFER, "pool": link.dst, "variant": LINK_VARIANT,
        "source_pool": link.src, "source": ProfileSource.TELEMETRY.value, "batch_curve": [],
        "step_latency_s_p50": 0.0, "step_latency_s_p90": 0.0, "step_latency_s_p99": 0.0, "tokens_per_s": 0.0,
        "mem_bytes_per_token": 0.0, "kv_bytes_per_token": 0.0, "transfer_bytes_per_s": link.bytes_per_s,
        "transfer_latency_s": link.latency_s, "error_rate": 0.0, "quality_score": None, "samples": link.samples,
        "window_s": float(window_s), "updated_at": _ms(link.updated_at),
    }


def record_key(record: Mapping[str, Any]) -> str:
    """Key of a record on the compacted topic (``phaseroute.schemas.ids.profile_key``); a
    record's source is part of the key so PROFILER and TELEMETRY rows of one pool both survive."""
    parts = (record["model"], record["phase"], record["pool"], record["variant"])
    if record["phase"] == TRANSFER:
        return profile_key(*parts, source_pool=record["source_pool"])
    return profile_key(*parts) + "|" + str(record["source"]).lower()


def from_avro(record: Mapping[str, Any], default_quality_score: float = 1.0) -> ProfileRow | LinkProfile:
    """A decoded ``profile_row`` record as the policy's row (or link, for TRANSFER records)."""
    stamp = record["updated_at"]  # epoch ms, or a datetime where a reader applies the logical type
    updated_at = epoch_s(stamp) if isinstance(stamp, dt.datetime) else stamp / 1000.0
    if record["phase"] == TRANSFER:
        return LinkProfile(
            src=record["source_pool"], dst=record["pool"], bytes_per_s=float(record["transfer_bytes_per_s"]),
            latency_s=float(record["transfer_latency_s"] or 0.0), samples=int(record["samples"]), updated_at=updated_at,
        )
    curve = tuple(CurvePoint(int(p["batch_size"]), float(p["tokens_per_s"])) for p in record["batch_curve"])
    quality = record["quality_score"]
    return ProfileRow(
        model=record["model"], phase=Phase(record["phase"]), pool=record["pool"],
        variant=record["variant"], curve=curve or (CurvePoint(1, max(float(record["tokens_per_s"]), NO_THROUGHPUT)),),
        step_p50_s=float(record["step_latency_s_p50"]), step_p90_s=float(record["step_latency_s_p90"]),
        step_p99_s=float(record["step_latency_s_p99"]), mem_bytes_per_token=float(record["mem_bytes_per_token"]),
        kv_bytes_per_token=float(record["kv_bytes_per_token"]), error_rate=float(record["error_rate"]),
        quality_score=default_quality_score if quality is None else float(quality), samples=int(record["samples"]),
        updated_at=updated_at, source=ProfileSource(record["source"]),
    )


def table_from_avro(
    records: Iterable[Mapping[str, Any]], table: ProfileTable | None = None, default_quality_score: float = 1.0
) -> ProfileTable:
    """``table`` (or an empty one) with every record's row or link (a later record replaces an earlier)."""
    rows: list[ProfileRow] = []
    links: list[LinkProfile] = []
    for record in records:
        item = from_avro(record, default_quality_score)
        if isinstance(item, LinkProfile):
            links.append(item)
        else:
            rows.append(item)
    return (table or ProfileTable()).with_rows(rows, links)


# -- cold start: engine_profile grid rows -> PROFILER rows -------------------------------------------


def profiler_aggregates(grid: Iterable[Mapping[str, Any]]) -> list[PhaseAggregate]:
    """One aggregate per (model, phase, pool, variant, batch size) of ``engine_profile`` rows
    (the table's columns, as SQL returns them or ``engine.profiler.profile_executor`` builds
    them): throughput and median latency averaged over the sequence lengths of the grid, the
    slowest cell as p90/p99, memory and KV bytes per token averaged."""
    cells: dict[tuple[str, str, str, str, int], list[Mapping[str, Any]]] = defaultdict(list)
    for r in grid:
        cells[(r["model"], str(r["phase"]), r["pool"], r["variant"], int(r["batch_size"]))].append(r)
    out = []
    for (model, phase, pool, variant, batch), rows in sorted(cells.items()):
        slowest = max(float(r["latency_s"]) for r in rows)
        p50 = min(slowest, fmean(float(r["latency_p50_s"]) for r in rows))
        out.append(PhaseAggregate(
            model=model, phase=Phase(phase), pool=pool, variant=variant, batch_size=batch,
            samples=sum(int(r["samples"]) for r in rows), tokens_per_s=fmean(float(r["tokens_per_s"]) for r in rows),
            step_p50_s=p50, step_p90_s=slowest, step_p99_s=slowest, errors=0,
            mem_bytes_per_token=fmean(float(r["memory_bytes_per_token"]) for r in rows),
            kv_bytes_per_token=fmean(float(r["kv_bytes_per_token"]) for r in rows),
            last_seen=max(epoch_s(r["at"]) for r in rows),
        ))
    return out


def profiler_rows(grid: Iterable[Mapping[str, Any]], now: float) -> list[ProfileRow]:
    """PROFILER rows (curve: tokens/s vs batch size) from cold-start grid rows, built by the
    policy's ``build_profile_rows`` like telemetry rows (the simulator does the same)."""
    rows = build_profile_rows(profiler_aggregates(grid), now, ProfileBuilderConfig())
    return [replace(r, source=ProfileSource.PROFILER) for r in rows]
