"""Where a live pipeline run's time went, measured from what the run left behind.

For one job run between ``since`` and ``until`` (epoch seconds) on a stack this process tree
started:

* per process: CPU seconds (psutil, the process and its children) and busy fraction (CPU
  seconds / wall, in cores) and RSS: ``ProcessCPU`` samples them at the start and the end;
* per pool and phase, from ``phase_telemetry`` in ClickHouse (deduplicated by batch id):
  batches, mean batch size, prompt tokens in, tokens out, busy fraction (execution seconds /
  wall) and the mean queue wait of prefill batches;
* per request, from the job's ``results`` records: seconds in the system against seconds of
  compute (prefill + KV transfer + decode); the rest is waiting (queues, Kafka hops, the
  control plane), and the Kafka hops each path takes;
* canaries: the drift monitor's requests that finished in the window (``canary.results``) and
  their prompt tokens against the job's;
* the telemetry service: rows it inserted in the window and its CPU per row.
"""

from __future__ import annotations

import statistics
import uuid
from typing import Any

import psutil

from phaseroute.config import Settings
from phaseroute.infra import processes
from phaseroute.infra.kafka_security import with_cluster_config
from phaseroute.infra.topics import CANARY_RESULTS, RESULTS

# topics a request crosses: jobs.submitted, requests.pending, prefill.<pool>, results, results.written
HOPS_COLOCATED = 5
HOPS_DISAGGREGATED = HOPS_COLOCATED + 2  # + kv.ready, decode.<pool>


class ProcessCPU:
    """CPU seconds of the stack's processes (each with its children) between two samples."""

    def __init__(self, settings: Settings, names: list[str]) -> None:
        self.procs: dict[str, psutil.Process] = {}
        for name in names:
            pid = processes.alive_pid(settings.run_dir, name)
            if pid is not None:
                self.procs[name] = psutil.Process(pid)
        self.start = self._sample()

    def _sample(self) -> dict[str, float]:
        out = {}
        for name, proc in self.procs.items():
            try:
                tree = [proc, *proc.children(recursive=True)]
                out[name] = sum(p.cpu_times().user + p.cpu_times().system for p in tree)
            except psutil.NoSuchProcess:  # it exited: its figures are missing from this sample
                continue
        return out

    def report(self, wall_s: float) -> dict[str, dict[str, float]]:
        end = self._sample()
        out = {}
        for name, proc in self.procs.items():
            if name not in end or name not in self.start:
                out[name] = {"cpu_s": -1.0, "busy_cores": -1.0, "rss_mb": 0.0}  # exited during the run
                continue
            cpu = max(0.0, end[name] - self.start[name])
            try:
                rss = proc.memory_info().rss
            except psutil.NoSuchProcess:
                rss = 0
            out[name] = {"cpu_s": round(cpu, 2), "busy_cores": round(cpu / wall_s, 3), "rss_mb": round(rss / 2**20, 1)}
        return out


def pool_phases(settings: Settings, since: float, until: float) -> list[dict[str, Any]]:
    from phaseroute.consumers.query_server import remote_query

    db = settings.clickhouse_database
    sql = (
        "SELECT pool, phase, count() AS batches, avg(batch_size), sum(tokens_in), sum(tokens_out), sum(exec_time_s), "
        "avg(queue_wait_s), sum(steps) "
        f"FROM (SELECT * FROM {db}.phase_telemetry FINAL WHERE at >= fromUnixTimestamp64Milli({int(since * 1000)}) "
        f"AND at <= fromUnixTimestamp64Milli({int(until * 1000)})) GROUP BY pool, phase ORDER BY pool, phase"
    )
    wall = until - since
    rows = []
    for pool, phase, batches, mean_batch, tokens_in, tokens_out, busy, wait, steps in remote_query(settings.telemetry_port, sql)["rows"]:
        rows.append({
            "pool": pool, "phase": phase, "batches": int(batches), "steps": int(steps),
            "mean_batch_size": round(float(mean_batch), 2), "tokens_in": int(tokens_in), "tokens_out": int(tokens_out),
            "busy_fraction": round(float(busy) / wall, 3), "mean_queue_wait_s": round(float(wait), 3),
        })
    return rows


def telemetry_rows(settings: Settings, since: float, until: float) -> int:
    from phaseroute.consumers.query_server import remote_query

    db, window = settings.clickhouse_database, (int(since * 1000), int(until * 1000))
    total = 0
    for table in ("phase_telemetry", "pool_heartbeat"):
        sql = (f"SELECT count() FROM {db}.{table} WHERE at >= fromUnixTimestamp64Milli({window[0]}) "
               f"AND at <= fromUnixTimestamp64Milli({window[1]})")
        total += int(remote_query(settings.telemetry_port, sql)["rows"][0][0])
    return total


def _records(settings: Settings, topic: str, since: float, kind: str = "result") -> list[dict[str, Any]]:
    from confluent_kafka import Consumer

    from phaseroute.cli.pools_cmd import read_since

    consumer = Consumer(with_cluster_config({"bootstrap.servers": settings.bootstrap_servers,
                                             "group.id": f"bench-{uuid.uuid4().hex[:8]}",
                                             "enable.auto.commit": False, "enable.partition.eof": True}))
    try:
        return read_since(consumer, topic, since, kind, timeout_s=20.0)
    finally:
        consumer.close()


def attempts(settings: Settings, job_id: str, since: float, until: float, pools: list[str]) -> dict[str, float]:
    """Work messages per request of the job (more than 1 prefill_work: retries or speculative
    copies were sent), and the canaries the drift monitor sent to the pools in the window
    (tenant ``_canary``, straight to the pool topics) with their prompt tokens."""
    from phaseroute.infra.topics import decode_topic, prefill_topic
    from phaseroute.schemas.ids import CANARY_TENANT

    counts = {"prefill_work": 0, "decode_work": 0}
    requests: set[str] = set()
    canaries = canary_tokens = 0
    for pool in pools:
        for kind, topic in (("prefill_work", prefill_topic(pool)), ("decode_work", decode_topic(pool))):
            for record in _records(settings, topic, since, kind):
                if record["job_id"] == job_id:
                    counts[kind] += 1
                    requests.add(record["request_id"])
                elif kind == "prefill_work" and record["tenant"] == CANARY_TENANT and record["dispatched_at"] <= until * 1000:
                    canaries += 1
                    canary_tokens += record["prompt_tokens"]
    n = max(1, len(requests))
    return {**{f"{kind}_per_request": round(count / n, 2) for kind, count in counts.items()},
            "canary_prefill_work_sent": canaries, "canary_prefill_work_prompt_tokens": canary_tokens}


def requests_and_canaries(settings: Settings, job_id: str, submitted: float, since: float, until: float,
                          pools: list[str]) -> dict[str, Any]:
    """Per request: time in the system vs compute, Kafka hops; canaries that ran on ``pools`` in
    the window (a canary failed without running, e.g. one a restarted control plane restored
    for a pool of an earlier stack, names no pool and cost no compute: not counted)."""
    first: dict[str, dict[str, Any]] = {}
    results = [r for r in _records(settings, RESULTS, since) if r["job_id"] == job_id]
    for r in results:
        if r["job_id"] == job_id and r["request_id"] not in first:
            first[r["request_id"]] = r
    in_system = [r["completed_at"] / 1000 - submitted for r in first.values()]
    compute = [r["prefill_time_s"] + r["kv_transfer_s"] + r["decode_time_s"] for r in first.values()]
    colocated = sum(1 for r in first.values() if r["colocated"])
    canaries = [r for r in _records(settings, CANARY_RESULTS, since)
                if r["completed_at"] / 1000 <= until and (r["prefill_pool"] in pools or r["decode_pool"] in pools)]
    job_prompt = sum(r["prompt_tokens"] for r in first.values())
    canary_prompt = sum(r["prompt_tokens"] for r in canaries)
    canary_out = sum(r["completion_tokens"] for r in canaries)
    job_out = sum(r["completion_tokens"] for r in first.values())
    return {
        "requests": len(first), "results_per_request": round(len(results) / max(1, len(first)), 2),
        "mean_in_system_s": _mean(in_system), "mean_compute_s": _mean(compute),
        "mean_waiting_s": _mean([a - b for a, b in zip(in_system, compute)]),  # queues, Kafka hops, control plane
        "kafka_hops_per_request": {"colocated": HOPS_COLOCATED, "disaggregated": HOPS_DISAGGREGATED},
        "requests_colocated": colocated, "requests_disaggregated": len(first) - colocated,
        "kafka_messages_per_request": round((colocated * HOPS_COLOCATED + (len(first) - colocated) * HOPS_DISAGGREGATED)
                                            / max(1, len(first)), 2),
        "canary_requests": len(canaries), "canary_prompt_tokens": canary_prompt, "canary_output_tokens": canary_out,
        "canary_share_of_prompt_tokens": round(canary_prompt / max(1, canary_prompt + job_prompt), 3),
        "canary_share_of_tokens": round((canary_prompt + canary_out) / max(1, canary_prompt + canary_out + job_prompt + job_out), 3),
    }


def _mean(values: list[float]) -> float:
    return round(statistics.mean(values), 2) if values else 0.0
