"""`phaseroute up --pools` on the real broker, as a new user runs it: a new pool is profiled before
it takes work, so the first job after `up` is admitted; `status`/`pools` --json parse; a pool added
to the running stack is profiled while the telemetry service pauses; `down` stops everything, a
worker started by hand included, each on SIGTERM.

One stack (a state dir, telemetry port and pool names of this module's own) serves the module;
the tests run in file order and the last ones change it (a second `up`, then `down`).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from phaseroute.infra import processes

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.slow]
CLI = [sys.executable, "-m", "phaseroute.cli.main"]
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "EXPIRED", "REJECTED"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cli(env: dict[str, str], *args: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout_s)


def ours(home: Path) -> list[psutil.Process]:
    """Processes whose command line or environment names this module's state dir."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(home) in " ".join(proc.info["cmdline"] or []) or proc.environ().get("PHASEROUTE_HOME") == str(home):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return [p for p in found if p.pid != os.getpid()]


def wait_final(bootstrap: str, job_id: str, timeout_s: float) -> dict[str, Any]:
    from phaseroute.cli.jobs_cmds import latest_job_states

    deadline = time.monotonic() + timeout_s
    event: dict[str, Any] = {}
    while time.monotonic() < deadline:
        event = latest_job_states(bootstrap, idle_s=0.2).get(job_id, {})
        if event.get("state") in FINAL:
            return event
        time.sleep(1.0)
    raise AssertionError(f"job {job_id} not final after {timeout_s:.0f} s: {event}")


@pytest.fixture(scope="module")
def stack(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("stack-home")
    real_models = Path(os.environ.get("PHASEROUTE_HOME", Path.home() / ".cache" / "phaseroute")) / "models"
    if real_models.exists():
        (home / "models").symlink_to(real_models)
    env = {**os.environ, "PHASEROUTE_HOME": str(home), "PHASEROUTE_BOOTSTRAP_SERVERS": bootstrap,
           "PHASEROUTE_TELEMETRY_PORT": str(free_port())}
    env.pop("PHASEROUTE_PROCESS_NAME", None)
    pool, added = f"cs{uuid.uuid4().hex[:6]}", f"ca{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    up = cli(env, "up", "--pools", f"{pool}=both:fp32:1")
    up_s = time.monotonic() - started
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        batch = home / "batch.jsonl"
        batch.write_text("".join(json.dumps({
            "custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "smollm2-135m", "messages": [{"role": "user", "content": text}], "max_tokens": 4}}) + "\n"
            for i, text in enumerate(["Say hi.", "Name a colour."])))
        submitted = cli(env, "submit", str(batch), "--tenant", "acme", timeout_s=60)  # right after `up` returned
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip().splitlines()[-1]
        yield {"env": env, "home": home, "pool": pool, "added": added, "up": up, "up_s": up_s, "job_id": job_id,
               "event": wait_final(bootstrap, job_id, 300)}
    finally:
        cli(env, "down", timeout_s=300)
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": bootstrap})
        names = [f"{kind}.{p}" for p in (pool, added) for kind in ("prefill", "decode")]
        for future in admin.delete_topics(names).values():
            try:
                future.result(timeout=30)
            except Exception:
                pass


def test_up_profiles_a_new_pool_before_its_workers_start(stack: dict[str, Any]) -> None:
    lines = stack["up"].stderr.splitlines()
    pool = stack["pool"]
    profiled = next(i for i, line in enumerate(lines) if f"pool {pool}: measured in" in line)
    worker = next(i for i, line in enumerate(lines) if f"started worker-{pool}-0" in line)
    ready = next(i for i, line in enumerate(lines) if "ready: 1 pool(s) alive and profiled" in line)
    assert profiled < worker < ready
    print(f"up --pools (Kafka given, fresh state dir, one pool) took {stack['up_s']:.0f} s")


def test_the_first_job_after_up_is_admitted_and_runs(stack: dict[str, Any]) -> None:
    event = stack["event"]
    assert event["state"] == "COMPLETED", event
    assert (event["requests_done"], event["requests_total"]) == (2, 2)


def test_status_json_is_one_document(stack: dict[str, Any]) -> None:
    status = cli(stack["env"], "status", stack["job_id"], "--json", timeout_s=60)
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["job_id"] == stack["job_id"] and doc["state"] == "COMPLETED"


def test_pools_json_shows_the_live_pool_and_only_its_phase(stack: dict[str, Any]) -> None:
    shown = cli(stack["env"], "pools", "--json", "--pool", stack["pool"], timeout_s=60)
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)["pools"]
    assert [(r["pool"], r["phase"], r["state"]) for r in rows] == [(stack["pool"], "both", "alive")]
    # what the admission desks judge with: the dispatcher's snapshot, fresh, with the measured pool's rates
    load = json.loads(shown.stdout)["control"]["load"]
    rate = load["fleet"]["smollm2-135m"]
    assert rate["prefill_tokens_per_s"] > 0 and rate["decode_tokens_per_s"] > 0 and 0 <= load["age_s"] < 15, load
    shown = cli(stack["env"], "pools", "--pool", stack["pool"], timeout_s=60)
    line = " ".join(shown.stderr.split())  # the console wraps long lines
    assert re.search(r"the fleet per model \(what admission judges with\): smollm2-135m [1-9]\d* prefill / [1-9]\d* decode", line), line


def test_a_pool_added_to_the_running_stack_is_profiled_while_telemetry_pauses(stack: dict[str, Any]) -> None:
    env, run_dir = stack["env"], stack["home"] / "run"
    telemetry_before = processes.alive_pid(run_dir, "telemetry")
    # threads named in both specs: left out, they are planned over all pools (2 then 1 here), and a
    # profile is per thread count, so the first pool would need a new one
    second = cli(env, "up", "--pools", f"{stack['pool']}=both:fp32:1,{stack['added']}=prefill:fp32:1")
    assert second.returncode == 0, second.stderr[-3000:]
    out = second.stderr
    assert f"pool {stack['added']}: measured in" in out
    assert f"cold-start profile of pool {stack['pool']}" not in out  # known through the telemetry service
    assert "pausing telemetry" in out and "started telemetry again" in out
    telemetry_after = processes.alive_pid(run_dir, "telemetry")
    assert telemetry_after is not None and telemetry_after != telemetry_before
    assert "ready: 2 pool(s) alive and profiled" in out


def test_down_stops_every_process_a_hand_started_worker_included(stack: dict[str, Any]) -> None:
    env, run_dir = stack["env"], stack["home"] / "run"
    log = open(stack["home"] / "hand-worker.log", "ab")
    by_hand = subprocess.Popen([*CLI, "worker", "--pool", stack["pool"], "--phase", "both", "--threads", "1"], env=env,
                               stdout=log, stderr=subprocess.STDOUT)  # in the test's own process group, as from a shell
    deadline = time.monotonic() + 120
    name = f"worker-{stack['pool']}-both-{by_hand.pid}"
    while processes.alive_pid(run_dir, name) is None:
        assert by_hand.poll() is None and time.monotonic() < deadline, "the hand-started worker did not record itself"
        time.sleep(0.5)
    time.sleep(5)  # let it join its group and take partitions: SIGTERM then has work to hand back
    down = cli(env, "down", timeout_s=300)
    assert down.returncode == 0, down.stderr
    assert f"{name} (pid {by_hand.pid}): stopped on SIGTERM" in down.stderr
    assert "killed" not in down.stderr, down.stderr
    assert processes.wait_gone(by_hand.pid, 10)
    left = ours(stack["home"])
    assert left == [], f"left running: {[p.cmdline()[:4] for p in left]}"
    assert processes.names(run_dir) == []
