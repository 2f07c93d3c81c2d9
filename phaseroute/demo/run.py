"""``phaseroute demo``: the whole product on this machine, end to end, with real parts.

0. A state of its own (``isolation``): leftovers of an earlier run are stopped and wiped; the
   broker, ClickHouse data, results and Faust changelogs live under ``<home>/demo`` on ports of
   the demo's own, so no earlier run and no other stack can change its outcome.
1. Kafka (unless --bootstrap-servers names a cluster) and the topic spec.
2. Cold-start profiles: each pool's variant is microbenchmarked (`phaseroute profile --quick`)
   into ClickHouse — the router's first measured rows.
3. The stack: telemetry service (ClickHouse + profile builder), result sink, control plane
   (Faust) and three real pools that differ: an fp32 prefill pool, an int8 decode pool and an
   fp32 colocated pool (SmolLM2-135M on CPU).
4. Jobs from three tenants (one floods), an infeasible job and a resubmitted job id. The
   tenants are registered with keys (the tenant registry); globex submits through the Batch
   API with the official ``openai`` SDK, the others as operator jobs on Kafka.
5. Live progress; then up to ``DRIFT_WAIT_S`` for a round of quality canaries to be measured
   (canaries are work of a reserved tenant that the fair scheduler releases at a small share
   while tenants' jobs queue, so their round often ends only after the jobs);
6. a summary measured from Kafka and ClickHouse, and the checks of
   ``checks`` (every job as expected, exactly one output line per request): a failed check is a
   failed demo. Everything it started is stopped at the end, also on Ctrl-C or failure.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from phaseroute.api.client_example import submit_with_sdk
from phaseroute.api.registry import add_tenant
from phaseroute.cli.drift_cmds import drift_summary
from phaseroute.cli.jobs_operator import job_record, latest_job_states, parse_deadline, publish
from phaseroute.config import Settings
from phaseroute.consumers.drift_monitor import paths_of
from phaseroute.demo import checks, isolation
from phaseroute.demo import summary as summarize
from phaseroute.demo.workload import TENANTS, DemoJob, demo_jobs, write_input
from phaseroute.engine.models import DEFAULT_MODEL as MODEL
from phaseroute.infra import cold_start, kafka_launcher, processes, provision, stack, topics
from phaseroute.infra.pool_spec import PoolSpec
from phaseroute.streams.policy import Phase, PoolState

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "EXPIRED", "REJECTED"}
DRIFT_WAIT_S = 60.0  # after the jobs, the longest the demo waits for a canary round to be measured


class DemoError(RuntimeError):
    """The demo could not run; the message says why."""


def register_tenants(settings: Settings) -> dict[str, str]:
    """The demo's tenants in the registry (weights and in-flight caps); tenant -> its API key."""
    keys = {}
    for name, spec in TENANTS.items():
        _, keys[name] = add_tenant(settings.bootstrap_servers, name, float(spec["weight"]),
                                   {"max_in_flight": spec.get("max_in_flight")})
    return keys


def submit_jobs(settings: Settings, jobs: list[DemoJob], workdir: Path, keys: dict[str, str]) -> list[DemoJob]:
    """Every job submitted; the SDK's one comes back with the id the API gave it."""
    submitted = []
    for job in jobs:
        path = write_input(job, workdir)
        if job.via_api:
            metadata = {"priority": str(job.priority), "quality_tier": job.quality}
            if job.tolerance is not None:
                metadata["quality_tolerance"] = str(job.tolerance)
            batch = submit_with_sdk(settings.api_base_url, keys[job.tenant], path, job.deadline, metadata)
            submitted.append(replace(job, job_id=batch.id))
            continue
        record = job_record(path, job.tenant, job.priority, parse_deadline(job.deadline, time.time()), job.job_id,
                            job.quality, MODEL, job.max_tokens, job.tolerance, settings.blob_store)
        for _ in range(2 if job.resubmit else 1):
            publish(settings.bootstrap_servers, topics.JOBS_SUBMITTED, job.job_id, "job_submitted", record)
        submitted.append(job)
    return submitted


def follow_jobs(settings: Settings, job_ids: list[str], names: list[str], console: Console, timeout_s: float) -> dict[str, Any]:
    states: dict[str, Any] = {}
    with Progress(TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as bar:
        tasks = {j: bar.add_task(j, total=None) for j in job_ids}
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            stack.check_running(settings, names)
            all_states = latest_job_states(settings.bootstrap_servers, idle_s=0.2)
            states = {j: all_states[j] for j in job_ids if j in all_states}
            for job_id, event in states.items():
                rejected = event["state"] == "REJECTED"
                bar.update(tasks[job_id], total=1 if rejected else event["requests_total"] or 1,
                           completed=1 if rejected else event["requests_done"] + event["requests_failed"],
                           description=f"{job_id} {event['state']}")
            if len(states) == len(job_ids) and all(e["state"] in FINAL for e in states.values()):
                return states
            time.sleep(1.0)
    raise DemoError(f"jobs not finished within {timeout_s:.0f} s: "
                    + ", ".join(f"{j}={states.get(j, {}).get('state')}" for j in job_ids))


def canary_paths(pools: list[PoolSpec], model: str = MODEL) -> int:
    """How many paths the drift monitor measures among ``pools`` once they are all alive (its own
    ``paths_of`` over them)."""
    def serves(spec: PoolSpec) -> frozenset[Phase]:
        return frozenset(Phase) if spec.phase == "both" else frozenset({Phase(spec.phase.upper())})

    alive = [PoolState(p.name, True, serves(p), frozenset({model}), p.variant, p.workers, p.max_decode_batch, 0.0)
             for p in pools]
    return len(paths_of(alive, [model]))


def wait_for_drift_rounds(settings: Settings, since: float, pools: list[PoolSpec], names: list[str],
                          console: Console, wait_s: float = DRIFT_WAIT_S) -> float:
    """Until ClickHouse holds a canary round measured since ``since`` on every path among
    ``pools``, at most ``wait_s``; the seconds waited."""
    want = canary_paths(pools)
    console.print(f"waiting up to {wait_s:.0f} s for a round of quality canaries on each of the {want} paths ...")
    started = time.time()
    while time.time() - started < wait_s:
        stack.check_running(settings, names)
        if len(drift_summary(settings.telemetry_port, since)["paths"]) >= want:
            break
        time.sleep(2.0)
    return time.time() - started


def print_summary(doc: dict[str, Any], console: Console) -> None:
    jobs = Table("job", "tenant", "state", "done/total", "tokens out", "s", "tokens/s", "deadline", title="Jobs")
    for j in doc["jobs"]:
        deadline = "missed" if j["deadline_missed"] else ("met" if j["state"] == "COMPLETED" else "-")
        jobs.add_row(j["job_id"], str(j["tenant"]), j["state"], f"{j['done']}/{j['requests']}", str(j["tokens_out"]),
                     str(j["seconds"] or "-"), str(j["tokens_per_s"] or "-"), deadline)
    console.print(jobs)
    for j in doc["jobs"]:
        if j["reason"]:
            console.print(f"  {j['job_id']} rejected: {j['reason']}", highlight=False)
    pools = Table("pool", "phase", "batches", "busy s", "utilization", "tokens in", "tokens out", "KV bytes", title="Pools")
    for p in doc["pools"]:
        pools.add_row(p["pool"], p["phase"], str(p["batches"]), str(p["busy_s"]), f"{p['utilization']:.0%}",
                      str(p["tokens_in"]), str(p["tokens_out"]), str(p["kv_bytes"]))
    console.print(pools)
    tenants = Table("tenant", "weight", "served cost", "share", "share while all backlogged", "weighted share",
                    title="Tenants (cost = input + 2 x output tokens)")
    for t in doc["tenants"]:
        tenants.add_row(t["tenant"], str(t["weight"]), str(t["served_cost"]), f"{t['share']:.1%}",
                        f"{t['share_while_all_backlogged']:.1%}", f"{t['weighted_share']:.1%}")
    console.print(tenants)
    r = doc["routing"]
    console.print(f"routing: {r['colocated']} colocated, {r['disaggregated']} disaggregated; paths {r['paths']}; "
                  f"KV moved {r['kv_bytes_moved']} bytes in {r['kv_transfer_s']} s", highlight=False)
    drift = doc.get("quality_drift", {})
    table = Table("path", "state", "exact ok", "top-1 agreement", "mean KL (nats)", "rounds", title="Quality drift (canaries)")
    for p in drift.get("paths", []):
        table.add_row(str(p["path"]), str(p["state_now"]), str(p["exact_ok_now"]), f"{p['top1_now']:.3f}",
                      f"{p['mean_kl_now']:.3g}", str(p["rounds"]))
    if table.row_count:
        console.print(table)
    else:  # canaries go through the fair scheduler at a small share of the tokens while jobs queue
        console.print(f"quality drift: no canary round was measured within {doc['drift_wait_s']} s after "
                      "the jobs (canaries get a small share of the tokens while tenants' work waits); "
                      "`phaseroute drift measure` on a running stack measures the paths", highlight=False)
    for alert in drift.get("alerts", []):
        console.print(f"  alert {alert['at_utc']} {alert['path']} {alert['kind']}: {alert['reason']}", highlight=False)
    console.print(f"{doc['output_tokens']} output tokens in {doc['wall_s']} s = {doc['output_tokens_per_s']} tokens/s; "
                  f"{doc['deadline_misses']} deadline misses", highlight=False)


def run_demo(settings: Settings, as_json: bool, scale: float, timeout_s: float, profile: bool) -> dict[str, Any]:
    console = Console(stderr=True)
    pools = stack.demo_pools()
    started: list[str] = []
    own_kafka = False
    settings, stopped = isolation.isolate(settings)
    if stopped:
        console.print(f"stopped what an earlier demo run left running: {', '.join(stopped)}")
    if settings.external_kafka:
        console.print(f"using the cluster at {settings.bootstrap_servers} as it is: an external broker cannot be "
                      "isolated, so leftovers of earlier runs there can change this run")
    console.print(f"demo state: {settings.home} (fresh)")
    try:
        if not settings.external_kafka:
            own_kafka = processes.alive_pid(settings.run_dir, "kafka") is None
            kafka_launcher.start(settings)
        provision.provision(settings.bootstrap_servers, topics.all_topics([p.name for p in pools]))
        if profile:
            cold_start.profile_new_pools(settings, pools, progress=lambda text: console.print(text, highlight=False))
        keys = register_tenants(settings)  # weights, in-flight caps and keys, before the control plane reads them
        started = stack.start(settings, pools, None, drift_interval_s=30.0)
        console.print(f"started {', '.join(started)}; waiting for pools and profiles ...")
        stack.wait_until_ready(settings, pools, started, timeout_s=240,
                               progress=lambda text: console.print(text, highlight=False))
        run = f"demo-{uuid.uuid4().hex[:6]}"
        since = time.time()
        jobs = submit_jobs(settings, demo_jobs(run, scale), settings.run_dir / "demo-inputs", keys)
        job_ids = [j.job_id for j in jobs]
        states = follow_jobs(settings, job_ids, started, console, timeout_s)
        until = time.time()
        drift_wait_s = wait_for_drift_rounds(settings, since, pools, started, console)
        time.sleep(2.0)  # the telemetry service flushes every second
        doc = summarize.collect(settings.bootstrap_servers, settings.telemetry_port, states, job_ids,
                                [p.name for p in pools], {t: v["weight"] for t, v in TENANTS.items()}, since, until,
                                prefill_pools=[p.name for p in pools if p.phase in ("prefill", "both")])
        doc["pools_spec"] = [p.__dict__ for p in pools]
        doc["drift_wait_s"] = round(drift_wait_s, 1)
        doc["checks"] = checks.check(jobs, states, settings.blob_store)
    finally:
        for name in reversed(started):
            processes.stop(settings.run_dir, name)
        if own_kafka:
            processes.stop(settings.run_dir, "kafka")
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        print_summary(doc, console)
    if not doc["checks"]["ok"]:
        raise DemoError(f"the main job is not as it must be: {checks.failures(doc['checks'])}")
    return doc
