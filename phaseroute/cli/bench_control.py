"""``phaseroute bench control``: what the control plane alone sustains, end to end.

On the running broker (``phaseroute up``, with no control plane of its own running) it starts
``--control`` real control-plane instances (one dispatcher, every one an admission desk) and the
real result sink as processes, announces a FAKE fleet of
instant workers (``consumers/instant_fleet.py``: no model runs, every work record is answered
at once with a one-token result), then submits ``--jobs`` jobs of ``--requests`` requests each,
one tenant per job, all at once (their ids on partitions of ``jobs.submitted`` owned by each
desk in turn, so the desks share them). It measures:
- each job's admission (submitted -> ADMITTED in ``jobs.state``: intake, tokenizing, admission,
  every request streamed to ``requests.pending``) and completion (-> COMPLETED, output whole);
- requests per second end to end (every request of every job, first submit -> last COMPLETED)
  and dispatched (work records the fake fleet answered, first -> last);
- the dispatch ticks' cost as the control plane logs it every 10 s (``streams/tick_stats.py``),
  with the most requests queued in each window;
- the fleet's side: the work it got per 10 s, and the longest time it got none between its
  first and its last work record (``fleet_longest_idle_s``: a dispatcher that stops releasing
  while requests wait, as it did while it read a big job before 2026-12-07, shows there);
- which instance's desk judged each job;
- what the dispatcher read back from its tables before it served (``restored_at_start``): a
  control plane stopped before it forgot its finished jobs' requests (the bench stops it as soon
  as the last job completes) leaves them there, and the next run on the same broker restores
  them first, and its figures carry that (2026-12-07, runs of 2 x 20,000 one after the other:
  the second restored 20,024 requests, the third 40,000; an instance started on ~20,000 of them
  served 37-50 s after its start). Compare runs on fresh brokers, or runs that restored the same.
Everything it started is stopped at the end. The figures are printed, never judged: the
issue's goal (>= 1,000 requests/s, a flat tick cost) is compared in the note.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import typer

from phaseroute.cli.common import console, current_settings, fail, json_stdout
from phaseroute.config import Settings

FINAL = ("COMPLETED", "FAILED", "REJECTED", "CANCELLED", "EXPIRED")
JUDGED = re.compile(r"admission desk: job (\S+) judged")


def _input(path: Path, n: int, tag: str) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"custom_id": f"{tag}{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
                "model": "smollm2-135m", "max_tokens": 1,
                "messages": [{"role": "user", "content": f"Request {i}: one fact about {i}."}]}}) + "\n")
    return path


def _wait_for_desks(bootstrap: str, instances: int, procs: dict[str, subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
    """Until the admission group has ``instances`` members, each with partitions; the partitions
    of ``jobs.submitted`` taken from each member in turn (jobs on them go to every desk in turn)."""
    from confluent_kafka.admin import AdminClient

    from phaseroute.infra.group_admin import describe_group
    from phaseroute.infra.topics import ADMISSION_GROUP

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dead = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"processes exited: {dead}")
        members = describe_group(admin, ADMISSION_GROUP, 10).members
        owned = [sorted(tp.partition for tp in m.assignment.topic_partitions) for m in members]
        if len(members) == instances and all(owned):
            return [p for turn in itertools.zip_longest(*owned) for p in turn if p is not None]
        time.sleep(0.5)
    raise TimeoutError(f"the admission group {ADMISSION_GROUP} did not reach {instances} members with partitions "
                       f"in {timeout_s:.0f} s")


def _wait_for_line(log: Path, needle: str, procs: dict[str, subprocess.Popen[bytes]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dead = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
        if dead:
            raise RuntimeError(f"processes exited: {dead}; logs in {log.parent}")
        if log.exists() and needle in log.read_text(errors="replace"):
            return
        time.sleep(0.5)
    raise TimeoutError(f"{needle!r} not in {log} after {timeout_s:.0f} s")


def _restored_at_start(log_text: str) -> dict[str, int] | None:
    """The requests and jobs the dispatcher read back from its tables (its ``RESTORED`` line)."""
    from phaseroute.cli.bench_failover import RESTORED_LINE

    match = RESTORED_LINE.search(log_text)
    return None if match is None else {"requests": int(match.group(1)), "jobs": int(match.group(2))}


def _spread_ids(run_id: str, jobs: int, partitions: list[int]) -> list[str]:
    """Job ids that land on ``partitions`` of ``jobs.submitted`` in turn."""
    from phaseroute.infra.topics import partition_of

    ids: list[str] = []
    n = 0
    while len(ids) < jobs:
        candidate = f"bench-{run_id}-{n}"
        if partition_of(candidate) == partitions[len(ids) % len(partitions)]:
            ids.append(candidate)
        n += 1
    return ids


def _judged_by(work: Path, instances: int) -> dict[str, str]:
    """Job id -> the control instance whose desk judged it (from the desks' log lines)."""
    out: dict[str, str] = {}
    for i in range(instances):
        for m in JUDGED.finditer((work / f"control-{i}.log").read_text(errors="replace")):
            out[m.group(1)] = f"control-{i}"
    return out


def run(settings: Settings, jobs: int, requests: int, pools: int, timeout_s: float, control: int = 1,
        kill_after_s: float | None = None) -> dict[str, Any]:
    from phaseroute.api.admission_bench import start_process, stop_processes
    from phaseroute.cli.bench_failover import FailoverProbe
    from phaseroute.cli.jobs_operator import job_record, latest_job_states, publish
    from phaseroute.consumers.instant_fleet import InstantFleet
    from phaseroute.infra.control_lease import lease_members
    from phaseroute.streams.shell import RESTORED
    from phaseroute.streams.tick_stats import LINE

    bootstrap = settings.bootstrap_servers
    running = lease_members(bootstrap)
    if running:
        raise RuntimeError(f"a control plane runs ({', '.join(m.client_id for m in running)}): the bench starts its "
                           "own; stop it first (`phaseroute down`, then `phaseroute up` without --pools)")
    work = Path(tempfile.mkdtemp(prefix="bench-control-"))
    probe = FailoverProbe(work, control, kill_after_s) if kill_after_s is not None else None
    procs: dict[str, subprocess.Popen[bytes]] = {}
    start_process(procs, work, "control-0", "control")
    start_process(procs, work, "results", "sink", "results")
    fleet = InstantFleet(bootstrap, pools)
    fleet.start()
    try:
        _wait_for_line(work / "control-0.log", RESTORED, procs, 180)  # the first instance is the dispatcher
        restored = _restored_at_start((work / "control-0.log").read_text(errors="replace"))
        for i in range(1, control):
            start_process(procs, work, f"control-{i}", "control")
        partitions = _wait_for_desks(bootstrap, control, procs, 120)
        time.sleep(3.0)  # the pool view has the fake pools' heartbeats
        submitted: dict[str, float] = {}
        for k, job_id in enumerate(_spread_ids(uuid.uuid4().hex[:6], jobs, partitions)):
            tenant = f"bench-tenant-{k}"
            record = job_record(_input(work / f"{job_id}.jsonl", requests, f"r{k}-"), tenant, 1, time.time() + 7200,
                                job_id, "exact", "smollm2-135m", 1, None, settings.blob_store)
            publish(bootstrap, "jobs.submitted", job_id, "job_submitted", record)
            submitted[job_id] = time.time()
        admitted: dict[str, float] = {}
        finished: dict[str, tuple[float, str]] = {}
        deadline = time.time() + timeout_s
        while len(finished) < jobs and time.time() < deadline:
            dead = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
            if dead:
                raise RuntimeError(f"processes exited: {dead}; logs in {work}")
            if probe is not None:
                probe.step(min(submitted.values()), procs)
            states = latest_job_states(bootstrap, idle_s=0.2)
            now = time.time()
            for job_id in submitted:
                state = states.get(job_id, {}).get("state")
                if state not in (None, "SUBMITTED") and job_id not in admitted:
                    admitted[job_id] = now
                if state in FINAL and job_id not in finished:
                    finished[job_id] = (now, state)
            time.sleep(0.5)
        first, last = min(submitted.values()), max((t for t, _ in finished.values()), default=time.time())
        total = jobs * requests
        dispatch_s = (fleet.last_work_at or 0.0) - (fleet.first_work_at or 0.0)
        ticks = [m.groupdict() for i in range(control)
                 for m in LINE.finditer((work / f"control-{i}.log").read_text(errors="replace"))]
        return {
            "fleet": f"FAKE: {pools} instant colocated pools (no model runs)", "control_instances": control,
            "jobs": jobs, "requests_per_job": requests, "restored_at_start": restored,
            "judged_by": _judged_by(work, control),
            "all_finished": len(finished) == jobs, "states": {j: s for j, (_, s) in finished.items()},
            "admission_s": {j: round(admitted[j] - submitted[j], 1) for j in admitted},
            "completion_s": {j: round(t - submitted[j], 1) for j, (t, _) in finished.items()},
            "end_to_end_s": round(last - first, 1),
            "requests_per_s_end_to_end": round(total / max(last - first, 1e-9), 1) if len(finished) == jobs else None,
            "dispatched": fleet.answered,
            "requests_per_s_dispatched": round(fleet.answered / dispatch_s, 1) if dispatch_s > 0 else None,
            "tick_windows": [{k: float(v) for k, v in t.items()} for t in ticks],
            # the fleet's side: the longest time it got no work mid-run (a dispatcher that stalls while
            # requests wait shows here), and the work it got per 10 s from the first submission
            "fleet_longest_idle_s": round(fleet.longest_idle_s, 1),
            "fleet_work_per_10s": fleet.work_per_window(first, last),
            **({"failover": probe.report(first)} if probe is not None else {}),
            "logs": str(work),
        }
    finally:
        fleet.stop()
        stop_processes(procs)


def bench_control(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    jobs: int = typer.Option(2, "--jobs", min=1, help="Jobs submitted at once, one tenant each."),
    requests: int = typer.Option(50_000, "--requests", min=1, help="Requests per job."),
    pools: int = typer.Option(4, "--pools", min=1, help="Fake instant pools."),
    timeout_s: float = typer.Option(1800.0, "--timeout-s", help="Give up on the jobs after this long."),
    control: int = typer.Option(1, "--control", min=1, max=4, help="Control-plane instances (admission desks; one dispatches)."),
    kill_after_s: float = typer.Option(None, "--kill-after", help="SIGKILL the dispatching instance this many seconds "
                                       "after the first submission (needs --control 2+): fail-over under load."),
) -> None:
    """The control plane alone on a FAKE fleet of instant workers: admission, requests/s end to
    end and dispatched, tick cost with the queue full. Needs `phaseroute up` and no control plane."""
    settings = current_settings()
    with json_stdout(as_json, indent=1) as emit:
        try:
            report = run(settings, jobs, requests, pools, timeout_s, control, kill_after_s)
        except (RuntimeError, TimeoutError) as exc:
            fail(str(exc))
        if as_json:
            emit(report)
            return
    for key, value in report.items():
        console.print(f"{key:>28}: {value}", highlight=False)
