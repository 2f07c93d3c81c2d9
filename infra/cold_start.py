"""Cold-start profiles for new pools, measured before the pools take work.

The router places work only on pools it has measured rows for. A pool that ``phaseroute up
--pools`` starts for the first time (or with another variant or thread count) therefore gets
a quick profiler run first (``phaseroute profile --quick --if-missing``: real prefill and
decode microbenchmarks into ClickHouse's ``engine_profile``), which the profile builder in the
telemetry service publishes on the ``profiles`` topic.

Embedded chdb allows one process per data path, and while the stack is up the telemetry
service holds it. Then the pools already profiled are read through the telemetry service's
query port; if some are not, the telemetry service is stopped for the measurement (it is a
Kafka consumer: it resumes from its committed offsets, nothing is lost) and started again with
the same command line. With a ClickHouse server nothing needs to stop.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

from phaseroute.config import Settings
from phaseroute.infra import processes
from phaseroute.infra.clickhouse import chdb_owner
from phaseroute.infra.pool_spec import PoolSpec

MODEL = "smollm2-135m"  # what `phaseroute worker` runs by default
PROFILE_TIMEOUT_S = 900.0


class ColdStartError(RuntimeError):
    """A pool could not be profiled; the message says which and why."""


def profile_new_pools(settings: Settings, pools: list[PoolSpec], progress: Callable[[str], None]) -> list[str]:
    """Profile every pool in ``pools`` that has no cold-start profile yet; return those measured."""
    holder = None if settings.clickhouse_url else chdb_owner(settings.chdb_path)
    if holder is None:
        return [p.name for p in pools if _profile(p, progress)]
    todo = [p for p in pools if not _known_through_service(settings, p)]
    if not todo:
        progress(f"cold-start profiles: all {len(pools)} pool(s) already profiled")
        return []
    name = _recorded_name(settings, holder)
    if name is None:
        raise ColdStartError(
            f"pools {', '.join(p.name for p in todo)} need a cold-start profile, but process {holder} (not one that "
            f"phaseroute recorded) holds the embedded ClickHouse at {settings.chdb_path}; stop it and run `up` again")
    record = processes.read_record(settings.run_dir, name)
    if record is None:
        raise ColdStartError(f"{name} (pid {holder}) holds the embedded ClickHouse but its command was not recorded; "
                             f"stop it (`phaseroute down`) and run `up` again")
    progress(f"pausing {name} (pid {holder}): it holds the embedded ClickHouse and "
             f"{len(todo)} new pool(s) need a cold-start profile")
    processes.stop(settings.run_dir, name)
    try:
        measured = [p.name for p in todo if _profile(p, progress)]
    finally:
        log = settings.run_dir / "logs" / f"{name}.log"
        pid = processes.spawn(settings.run_dir, name, record.cmd, log, env=_env(record.env))
        progress(f"started {name} again (pid {pid})")
    return measured


def _profile(pool: PoolSpec, progress: Callable[[str], None]) -> bool:
    """Run ``phaseroute profile --quick --if-missing`` for one pool; True if it measured."""
    progress(f"cold-start profile of pool {pool.name} ({pool.variant}, {pool.threads} thread(s)) ...")
    started = time.monotonic()
    cmd = [sys.executable, "-m", "phaseroute.cli.main", "profile", "--pool", pool.name, "--variant", pool.variant,
           "--threads", str(pool.threads), "--model", MODEL, "--quick", "--if-missing"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROFILE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ColdStartError(f"profiling pool {pool.name} took longer than {PROFILE_TIMEOUT_S:.0f} s") from None
    last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    if proc.returncode != 0:
        raise ColdStartError(f"profiling pool {pool.name} failed (exit {proc.returncode}): {last}")
    measured = "nothing measured" not in last
    progress(f"  pool {pool.name}: " + (f"measured in {time.monotonic() - started:.0f} s" if measured else "already profiled"))
    return measured


def _known_through_service(settings: Settings, pool: PoolSpec) -> bool:
    """True when the telemetry service answers that ``engine_profile`` holds this pool's run;
    False when it does not, or cannot say (then the profiler's own --if-missing decides)."""
    from phaseroute.consumers.query_server import QueryError, remote_query

    db = settings.clickhouse_database
    sql = (f"SELECT count() FROM {db}.engine_profile WHERE pool = '{pool.name}' AND variant = '{pool.variant}' "
           f"AND model = '{MODEL}' AND threads = {int(pool.threads)}")
    try:
        answer = remote_query(settings.telemetry_port, sql, timeout_s=10)
    except (QueryError, OSError, ValueError):
        return False
    rows = answer.get("rows") or [[0]]
    return int(rows[0][0]) > 0


def _recorded_name(settings: Settings, pid: int) -> str | None:
    return next((n for n, p in processes.running(settings.run_dir).items() if p == pid), None)


def _env(recorded: dict[str, str]) -> dict[str, str]:
    import os

    return {**os.environ, **recorded}
