"""The demo's summary, measured from what the run left in Kafka and ClickHouse: job states
(``jobs.state``), results with their routing (``results``), and pool telemetry (ClickHouse,
through the telemetry service)."""

from __future__ import annotations

import uuid
from typing import Any

from confluent_kafka import Consumer

from phaseroute.cli.drift_cmds import drift_summary
from phaseroute.cli.pools_cmd import read_since
from phaseroute.consumers.query_server import remote_query
from phaseroute.infra.kafka_security import with_cluster_config


def _consumer(bootstrap: str) -> Consumer:
    return Consumer(with_cluster_config({"bootstrap.servers": bootstrap, "group.id": f"demo-summary-{uuid.uuid4().hex}",
                                         "enable.auto.commit": False, "enable.partition.eof": True}))


def job_rows(states: dict[str, dict[str, Any]], results: list[dict[str, Any]], job_ids: list[str]) -> list[dict[str, Any]]:
    by_job: dict[str, dict[str, dict[str, Any]]] = {}
    for r in results:
        if r["status"] == "OK":
            by_job.setdefault(r["job_id"], {}).setdefault(r["request_id"], r)
    rows = []
    for job_id in job_ids:
        event = states.get(job_id, {})
        done = list(by_job.get(job_id, {}).values())
        elapsed = (event.get("at", 0) - event.get("submitted_at", 0)) / 1000 if event.get("state") in ("COMPLETED", "FAILED") else None
        tokens_out = sum(r["completion_tokens"] for r in done)
        rows.append({
            "job_id": job_id, "tenant": event.get("tenant"), "state": event.get("state", "UNKNOWN"),
            "reason": event.get("reason") if event.get("state") == "REJECTED" else None,
            "earliest_feasible_deadline_ms": event.get("earliest_feasible_deadline"),
            "requests": event.get("requests_total", 0), "done": event.get("requests_done", 0),
            "failed": event.get("requests_failed", 0), "tokens_out": tokens_out,
            "seconds": round(elapsed, 1) if elapsed else None,
            "tokens_per_s": round(tokens_out / elapsed, 1) if elapsed else None,
            "deadline_missed": event.get("deadline_missed", False),
        })
    return rows


def routing(results: list[dict[str, Any]], job_ids: set[str]) -> dict[str, Any]:
    first: dict[str, dict[str, Any]] = {}
    for r in results:
        if r["job_id"] in job_ids and r["status"] == "OK":
            first.setdefault(r["request_id"], r)
    paths: dict[str, int] = {}
    for r in first.values():
        key = r["prefill_pool"] if r["colocated"] else f"{r['prefill_pool']} -> {r['decode_pool']}"
        paths[key] = paths.get(key, 0) + 1
    return {
        "colocated": sum(r["colocated"] for r in first.values()),
        "disaggregated": sum(not r["colocated"] for r in first.values()),
        "paths": dict(sorted(paths.items(), key=lambda kv: -kv[1])),
        "kv_bytes_moved": sum(r["kv_bytes"] for r in first.values()),
        "kv_transfer_s": round(sum(r["kv_transfer_s"] for r in first.values()), 3),
    }


def tenant_shares(results: list[dict[str, Any]], releases: list[dict[str, Any]], job_ids: set[str],
                  weights: dict[str, float]) -> list[dict[str, Any]]:
    """Served cost (input + 2 x output tokens, as VTC counts it) per tenant vs its weighted share:
    over the whole run from the results, and from the fair scheduler's releases (the first
    ``prefill_work`` of each request, charged prompt + 2 x max_tokens) while every tenant still
    had work queued, i.e. until the first tenant's last release. Fairness is decided at release:
    completions lag it by the service time, so a window cut by completions would credit the
    tenant whose requests are quickest, not the scheduler's choices."""
    first: dict[str, dict[str, Any]] = {}
    for r in results:
        if r["job_id"] in job_ids and r["status"] == "OK":
            first.setdefault(r["request_id"], r)
    released: dict[str, dict[str, Any]] = {}
    for w in sorted(releases, key=lambda w: w["dispatched_at"]):
        if w["job_id"] in job_ids:
            released.setdefault(w["request_id"], w)
    last_release: dict[str, int] = {}
    for w in released.values():
        last_release[w["tenant"]] = max(last_release.get(w["tenant"], 0), w["dispatched_at"])
    contended_until = min(last_release.values(), default=0)

    whole: dict[str, float] = {}
    for r in first.values():
        whole[r["tenant"]] = whole.get(r["tenant"], 0) + r["prompt_tokens"] + 2 * r["completion_tokens"]
    contended: dict[str, float] = {}
    for w in released.values():
        if w["dispatched_at"] <= contended_until:
            contended[w["tenant"]] = contended.get(w["tenant"], 0) + w["prompt_tokens"] + 2 * w["max_tokens"]
    total, total_c = sum(whole.values()) or 1, sum(contended.values()) or 1
    weight_total = sum(weights.get(t, 1.0) for t in whole) or 1
    return [{"tenant": t, "weight": weights.get(t, 1.0), "served_cost": int(c), "share": round(c / total, 3),
             "share_while_all_backlogged": round(contended.get(t, 0) / total_c, 3),
             "weighted_share": round(weights.get(t, 1.0) / weight_total, 3)} for t, c in sorted(whole.items())]


def pool_utilization(port: int, pools: list[str], since_s: float, until_s: float) -> list[dict[str, Any]]:
    """Busy fraction per pool and phase from telemetry (sum of batch execution time / wall time)."""
    names = ", ".join(f"'{p}'" for p in pools)
    sql = (
        "SELECT pool, phase, count(DISTINCT batch_id), sum(exec_time_s), sum(tokens_in), sum(tokens_out), sum(kv_bytes) "
        f"FROM phaseroute.phase_telemetry WHERE pool IN ({names}) "
        f"AND at >= fromUnixTimestamp64Milli(toInt64({int(since_s * 1000)})) "
        f"AND at <= fromUnixTimestamp64Milli(toInt64({int(until_s * 1000)})) GROUP BY pool, phase ORDER BY pool, phase"
    )
    wall = max(1e-9, until_s - since_s)
    return [{"pool": p, "phase": ph, "batches": int(n), "busy_s": round(busy, 2), "utilization": round(busy / wall, 3),
             "tokens_in": int(tin), "tokens_out": int(tout), "kv_bytes": int(kv)}
            for p, ph, n, busy, tin, tout, kv in remote_query(port, sql)["rows"]]


def collect(bootstrap: str, port: int, states: dict[str, dict[str, Any]], job_ids: list[str], pools: list[str],
            weights: dict[str, float], since_s: float, until_s: float,
            prefill_pools: list[str] | None = None) -> dict[str, Any]:
    """The demo's summary; ``prefill_pools`` (default: ``pools``) are the pools whose
    ``prefill.<pool>`` topic holds the fair scheduler's releases."""
    consumer = _consumer(bootstrap)
    try:
        results = read_since(consumer, "results", since_s - 5, "result", timeout_s=15)
        releases = [w for pool in (pools if prefill_pools is None else prefill_pools)
                    for w in read_since(consumer, f"prefill.{pool}", since_s - 5, "prefill_work", timeout_s=15)]
    finally:
        consumer.close()
    ours = set(job_ids)
    jobs = job_rows(states, results, job_ids)
    tokens = sum(j["tokens_out"] for j in jobs)
    return {
        "wall_s": round(until_s - since_s, 1),
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / max(1e-9, until_s - since_s), 2),
        "jobs": jobs,
        "deadline_misses": sum(1 for j in jobs if j["deadline_missed"]),
        "routing": routing(results, ours),
        "tenants": tenant_shares(results, releases, ours, weights),
        "pools": pool_utilization(port, pools, since_s, until_s),
        "quality_drift": drift_summary(port, since_s),
    }
