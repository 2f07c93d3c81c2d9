"""The local phaseroute stack beside Kafka: telemetry service, result sink, control plane, the
Batch API (``phaseroute api``), drift monitor, and the workers of each pool — each a process with a PID file, so ``phaseroute down``
stops them.

Life of ``phaseroute up --pools SPEC`` after the broker answers:
1. ``provision`` the pools' work topics;
2. ``cold_start.profile_new_pools``: each pool without a cold-start profile of its variant and
   threads is microbenchmarked (``phaseroute profile --quick``) into ClickHouse, so the router
   can place work on it from the first job;
3. ``start``: the services and ``workers`` processes of each pool, recorded in the run dir
   (``stack.json`` keeps the pool specs, so ``phaseroute pools`` shows a pool that is starting);
4. ``wait_until_ready``: every pool has a live worker (heartbeats) and profile rows on the
   ``profiles`` topic, which is what admission needs to accept the first job.

Pool specs: see ``pool_spec`` (``NAME=PHASE:VARIANT[:THREADS][xWORKERS]``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from phaseroute.config import Settings
from phaseroute.infra import processes, provision, topics
from phaseroute.infra.pool_spec import PHASES, POOL_SPEC_EXAMPLE, POOL_SPEC_FORM, PoolSpec, parse_pools

__all__ = [
    "DEMO_POOLS", "demo_pools", "PHASES", "POOL_SPEC_EXAMPLE", "POOL_SPEC_FORM", "PoolSpec", "Progress", "check_running",
    "parse_pools", "PoolReadiness", "recorded_pools", "start", "wait_for", "wait_until_ready",
]

Progress = Callable[[str], None]
STACK_FILE = "stack.json"

DEMO_POOLS = "prefill-fp32=prefill:fp32,decode-int8=decode:int8-dynamic,colo-fp32=both:fp32"


def demo_pools(cores: int | None = None) -> list[PoolSpec]:
    """The demo's three pools, threads and workers planned for the machine (``cores``: this process's)."""
    return parse_pools(DEMO_POOLS, cores)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "phaseroute.cli.main", *args]


def _quiet(_message: str) -> None:
    pass


def start(settings: Settings, pools: list[PoolSpec], tenants_file: Path | None = None,
          drift_interval_s: float | None = 60.0, progress: Progress = _quiet, control_instances: int = 1) -> list[str]:
    """Provision the pools' topics and start services and workers; return the process names.
    The drift monitor runs canaries on every path every ``drift_interval_s`` (None: no monitor).
    ``control_instances``: control planes ``control``, ``control-2``, ...: one holds the control
    lease and runs, the others wait as standbys (``infra/control_lease.py``)."""
    provision.provision(settings.bootstrap_servers, topics.all_topics([p.name for p in pools]))
    record_pools(settings, pools)
    logs = settings.run_dir / "logs"
    started = []

    def spawn(name: str, cmd: list[str]) -> None:
        pid = processes.alive_pid(settings.run_dir, name)
        if pid is None:
            pid = processes.spawn(settings.run_dir, name, cmd, logs / f"{name}.log")
            progress(f"started {name} (pid {pid})")
        else:
            progress(f"{name} already runs (pid {pid})")
        started.append(name)

    holder = _telemetry_already_running(settings)
    if holder is None:
        spawn("telemetry", _cli("sink", "telemetry"))
    else:  # a second one could not open the embedded chdb
        progress(f"the telemetry service already runs as {holder} (pid {processes.alive_pid(settings.run_dir, holder)})")
        started.append(holder)
    spawn("results", _cli("sink", "results"))
    for k in range(control_instances):
        spawn("control" if k == 0 else f"control-{k + 1}",
              _cli("control", *(["--tenants", str(tenants_file)] if tenants_file else [])))
    spawn("api", _cli("api", "--host", settings.api_host, "--port", str(settings.api_port)))
    if drift_interval_s is not None:
        spawn("drift", [sys.executable, "-m", "phaseroute.cli.drift_cmds", "monitor", "--interval-s", str(drift_interval_s)])
    for pool in pools:
        for i in range(pool.workers):
            spawn(f"worker-{pool.name}-{i}", _cli(
                "worker", "--pool", pool.name, "--phase", pool.phase, "--variant", pool.variant,
                "--threads", str(pool.threads), "--max-decode-batch", str(pool.max_decode_batch), "--nice", str(pool.nice),
                "--worker-id", f"{pool.name}-{i}",
            ))
    return started


def api_answers(settings: Settings) -> bool:
    """The Batch API's readiness URL answers 200."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{settings.api_host}:{settings.api_port}/healthz", timeout=2) as reply:
            return int(reply.status) == 200
    except OSError:
        return False


def _telemetry_already_running(settings: Settings) -> str | None:
    """The recorded name of a telemetry service started some other way (by hand: ``sink-telemetry-<pid>``)
    that holds the embedded chdb, or None."""
    from phaseroute.infra.clickhouse import chdb_owner

    if settings.clickhouse_url or processes.alive_pid(settings.run_dir, "telemetry") is not None:
        return None
    owner = chdb_owner(settings.chdb_path)
    return next((n for n, pid in processes.running(settings.run_dir).items() if pid == owner), None) if owner else None


def record_pools(settings: Settings, pools: list[PoolSpec]) -> None:
    """Add ``pools`` to the run dir's ``stack.json`` (what ``up`` started; ``down`` removes it)."""
    known = {p.name: p for p in recorded_pools(settings.run_dir)}
    known.update({p.name: p for p in pools})
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    path = settings.run_dir / STACK_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps({"pools": [p.to_dict() for p in known.values()]}, indent=1))
    tmp.replace(path)


def recorded_pools(run_dir: Path) -> list[PoolSpec]:
    """The pools ``up --pools`` started (and ``down`` has not stopped); [] when none or unreadable."""
    try:
        data = json.loads((run_dir / STACK_FILE).read_text())
        return [PoolSpec(**fields) for fields in data["pools"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def forget_pools(run_dir: Path) -> None:
    (run_dir / STACK_FILE).unlink(missing_ok=True)


def check_running(settings: Settings, names: list[str]) -> None:
    """Raise naming the processes that exited, with the tail of their logs."""
    dead = [n for n in names if processes.alive_pid(settings.run_dir, n) is None]
    if dead:
        tails = []
        for name in dead:
            log = settings.run_dir / "logs" / f"{name}.log"
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else ["(no log)"]
            tails.append(f"--- {name}\n" + "\n".join(tail))
        raise RuntimeError(f"processes exited: {', '.join(dead)}\n" + "\n".join(tails))


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str, settings: Settings, names: list[str]) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        check_running(settings, names)
        if condition():
            return
        time.sleep(1.0)
    raise TimeoutError(f"{what} not reached within {timeout_s:.0f} s")


class PoolReadiness:
    """Follows ``pools.heartbeat`` and ``profiles`` the way the control plane's views do, and says
    which of ``pools`` still lack a live worker or a profile row (what admission needs to accept
    work for them). Use as a context manager: the followers stop on exit."""

    def __init__(self, bootstrap: str, pools: Iterable[str]) -> None:
        from phaseroute.infra.topic_follower import TopicFollower
        from phaseroute.streams.views import PoolView, ProfileView

        self.wanted = set(pools)
        self._pool_view, self._profile_view = PoolView(), ProfileView()
        self._followers = [
            TopicFollower(bootstrap, "pools.heartbeat", "pool_heartbeat", self._pool_view.on_record, service="readiness"),
            TopicFollower(bootstrap, "profiles", "profile_row", self._profile_view.on_record, service="readiness")]

    def __enter__(self) -> PoolReadiness:
        for follower in self._followers:
            follower.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        for follower in self._followers:
            follower.stop()

    def missing(self) -> dict[str, set[str]]:
        """``{"not alive": pools, "no profile yet": pools}``, each empty once every pool is ready."""
        alive = {n for n, s in self._pool_view.states(time.time(), {}, {}).items() if s.alive}
        profiled = {row.pool for row in self._profile_view.table().rows.values()}
        return {"not alive": self.wanted - alive, "no profile yet": self.wanted - profiled}

    def ready(self) -> bool:
        return not any(self.missing().values())


def wait_until_ready(settings: Settings, pools: list[PoolSpec], names: list[str], timeout_s: float,
                     progress: Progress = _quiet, every_s: float = 10.0) -> None:
    """Every pool has a live worker and a profile row the router can use (what admission needs);
    ``progress`` hears what is still missing whenever it changes, and every ``every_s``."""
    said: dict[str, Any] = {"text": "", "at": 0.0}

    with PoolReadiness(settings.bootstrap_servers, [p.name for p in pools]) as readiness:
        def ready() -> bool:
            missing = readiness.missing()
            wanted = len(readiness.wanted)
            api = "api" not in names or api_answers(settings)
            text = (f"waiting for pools: {wanted - len(missing['not alive'])}/{wanted} alive, "
                    f"{wanted - len(missing['no profile yet'])}/{wanted} profiled"
                    + "".join(_missing(what, which) for what, which in missing.items())
                    + ("" if api else "; the Batch API does not answer yet"))
            if text != said["text"] or time.monotonic() - said["at"] >= every_s:
                progress(text)
                said.update(text=text, at=time.monotonic())
            return not any(missing.values()) and api

        wait_for(ready, timeout_s, "all pools alive and profiled", settings, names)


def _missing(what: str, pools: set[str]) -> str:
    return f"; {what}: {', '.join(sorted(pools))}" if pools else ""
