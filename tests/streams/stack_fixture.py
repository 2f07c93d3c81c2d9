"""A live phaseroute stack for control-plane integration tests: real processes (telemetry
service with the profile builder, result sink, Faust control plane, workers) on the real broker.

Pools are profiled once (`phaseroute profile --quick`) before the telemetry service takes the
embedded chdb, so the router has measured cold-start rows for them."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from phaseroute.cli.jobs_cmds import latest_job_states
from phaseroute.infra import provision, stack, topics

CLI = [sys.executable, "-m", "phaseroute.cli.main"]


def profile_pools(pools: dict[str, str], threads: int = 1) -> None:
    """pool name -> variant, measured into the default ClickHouse (engine_profile)."""
    for pool, variant in pools.items():
        proc = subprocess.run([*CLI, "profile", "--pool", pool, "--variant", variant, "--quick", "--threads", str(threads)],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


class LiveStack:
    def __init__(self, bootstrap: str, logs: Path) -> None:
        self.bootstrap = bootstrap
        self.logs = logs
        self.procs: dict[str, subprocess.Popen] = {}
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen([*CLI, *args], stdout=log, stderr=subprocess.STDOUT)
        return self.procs[name]

    def services(self) -> None:
        self.start("telemetry", "sink", "telemetry")
        self.start("results", "sink", "results")
        self.start("control", "control")

    def worker(self, pool: str, phase: str, variant: str = "fp32", *extra: str) -> subprocess.Popen:
        provision.provision(self.bootstrap, list(topics.pool_topics(pool)))
        return self.start(f"worker-{pool}", "worker", "--pool", pool, "--phase", phase, "--variant", variant,
                          "--threads", "1", "--worker-id", f"{pool}-0", *extra)

    def wait_ready(self, pools: list[str], timeout_s: float = 180.0) -> None:
        """Every pool has a live worker and a profile row, as the control plane's views read them:
        a job submitted before that is rightly rejected (no alive, profiled pool)."""
        with stack.PoolReadiness(self.bootstrap, pools) as readiness:
            deadline = time.time() + timeout_s
            while not readiness.ready():
                self.check()
                assert time.time() < deadline, f"pools not ready after {timeout_s:.0f} s: {readiness.missing()}; logs in {self.logs}"
                time.sleep(0.5)

    def check(self) -> None:
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        assert not dead, f"processes exited: {dead}; logs in {self.logs}"

    def stop(self, name: str, kill: bool = False) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.kill() if kill else proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def stop_all(self) -> None:
        """Newest first: standbys stop before the active control instance, so stopping the stack
        starts no takeover (a standby that took the lease as the active one stopped got SIGTERM
        while it restored; before ``hold_until_ready`` it hung 60 s until killed, and a takeover
        on the way down is time the tests need not spend: docs/operating-the-stack.md)."""
        for name in reversed(list(self.procs)):
            self.stop(name)

    def wait_job(self, job_id: str, timeout_s: float, final: bool = True, done_at_least: int = 0) -> dict:
        deadline = time.time() + timeout_s
        event: dict = {}
        while time.time() < deadline:
            self.check()
            event = latest_job_states(self.bootstrap, idle_s=0.2).get(job_id, {})
            if final and event.get("state") in ("COMPLETED", "FAILED", "REJECTED", "CANCELLED"):
                return event
            if not final and event.get("requests_done", 0) >= done_at_least:
                return event
            time.sleep(1.0)
        raise AssertionError(f"job {job_id}: {event.get('state')} {event.get('requests_done')}/{event.get('requests_total')} "
                             f"after {timeout_s:.0f} s; logs in {self.logs}")
