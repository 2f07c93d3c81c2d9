"""Builders for the policy tests: profile rows, pools and requests with readable defaults.

Tests get them through the ``mk`` fixture (``mk.row(...)``, ``mk.pool(...)``, ``mk.req(...)``)
because test modules are imported with ``--import-mode=importlib`` and cannot import each other.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from phaseroute.streams.policy import (
    CurvePoint,
    Phase,
    PoolState,
    ProfileRow,
    ProfileSource,
    ProfileTable,
    QualityTier,
    RequestWork,
)

NOW = 10_000.0
MODEL = "smollm2-135m"
BOTH = frozenset({Phase.PREFILL, Phase.DECODE})


def row(
    pool: str,
    phase: Phase,
    tps: float = 1000.0,
    *,
    model: str = MODEL,
    variant: str = "fp32",
    err: float = 0.0,
    quality: float = 1.0,
    samples: int = 1000,
    updated_at: float = NOW,
    source: ProfileSource = ProfileSource.TELEMETRY,
    kv: float = 1000.0,
    p99: float = 0.05,
) -> ProfileRow:
    """Throughput ``tps`` at batch 32, half of it at batch 8, an eighth at batch 1."""
    curve = (CurvePoint(1, tps / 8), CurvePoint(8, tps / 2), CurvePoint(32, tps))
    return ProfileRow(
        model, phase, pool, variant, curve, p99 / 4, p99 / 2, p99, 2 * kv, kv, err, quality, samples, updated_at, source
    )


def pool(
    name: str,
    *,
    phases: frozenset[Phase] = BOTH,
    models: frozenset[str] = frozenset({MODEL}),
    variant: str = "fp32",
    workers: int = 1,
    max_batch: int = 32,
    free_kv: float = 1e12,
    queue_tokens: int = 0,
    queue_requests: int = 0,
    in_flight: int = 0,
    alive: bool = True,
    heartbeat: float = NOW,
    price: float | None = None,
    worker_free_kv: float | None = None,
    worker_kv_capacity: float | None = None,
    kv_format: str | None = "m|float32|30x3x64|v1",
) -> PoolState:
    return PoolState(
        name,
        alive,
        phases,
        models,
        variant,
        workers,
        max_batch,
        free_kv,
        queue_requests,
        queue_tokens,
        in_flight,
        0,
        heartbeat,
        price,
        worker_free_kv,
        worker_kv_capacity,
        kv_format,
    )


def req(
    rid: str = "r1",
    *,
    prompt: int = 512,
    out: int = 128,
    tenant: str = "t",
    job: str = "j",
    deadline: float | None = None,
    tier: QualityTier = QualityTier.EXACT,
    tolerance: float = 0.0,
    avoid: frozenset[str] = frozenset(),
    model: str = MODEL,
) -> RequestWork:
    return RequestWork(rid, job, tenant, model, prompt, out, deadline, tier, tolerance, 0, avoid)


def table(*rows: ProfileRow, links=()) -> ProfileTable:
    return ProfileTable.from_rows(rows, links)


def both(pool_name: str, tps: float = 1000.0, **kw) -> list[ProfileRow]:
    """Prefill and decode rows for one pool (prefill 10x the decode throughput)."""
    return [row(pool_name, Phase.PREFILL, tps * 10, **kw), row(pool_name, Phase.DECODE, tps, **kw)]


@pytest.fixture()
def mk() -> SimpleNamespace:
    return SimpleNamespace(row=row, pool=pool, req=req, table=table, both=both, NOW=NOW, MODEL=MODEL, BOTH=BOTH)
