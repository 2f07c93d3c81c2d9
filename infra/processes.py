"""PID files for the processes ``phaseroute up`` starts, so ``phaseroute down`` stops exactly them.

Each process runs in its own session (process group). Its PID file holds the PID and the
process start time, so a recycled PID belonging to someone else is never signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import psutil


def _pid_file(run_dir: Path, name: str) -> Path:
    if not name or "/" in name:
        raise ValueError(f"process name {name!r} must be a non-empty file name")
    return run_dir / f"{name}.pid"


def spawn(run_dir: Path, name: str, cmd: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    """Start ``cmd`` detached in its own process group, logging to ``log_path``; record its PID."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env,
        )
    started = psutil.Process(proc.pid).create_time()
    _pid_file(run_dir, name).write_text(f"{proc.pid} {started}\n")
    return proc.pid


def alive_pid(run_dir: Path, name: str) -> int | None:
    """The PID recorded for ``name`` if that very process still runs (and is not a zombie)."""
    path = _pid_file(run_dir, name)
    if not path.exists():
        return None
    try:
        pid_text, started_text = path.read_text().split()
        proc = psutil.Process(int(pid_text))
        if abs(proc.create_time() - float(started_text)) > 1.0 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.pid
    except (ValueError, psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def names(run_dir: Path) -> list[str]:
    """Names of every process with a PID file under ``run_dir``."""
    return sorted(p.stem for p in run_dir.glob("*.pid")) if run_dir.exists() else []


def stop(run_dir: Path, name: str, grace_s: float = 20.0) -> bool:
    """SIGTERM the process group of ``name``, SIGKILL it after ``grace_s``; True if one was running."""
    pid = alive_pid(run_dir, name)
    _pid_file(run_dir, name).unlink(missing_ok=True)
    if pid is None:
        return False
    members = _group_members(pid)
    _signal_group(pid, signal.SIGTERM)
    _gone, alive = psutil.wait_procs(members, timeout=grace_s)
    if alive:
        _signal_group(pid, signal.SIGKILL)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
    return True


def stop_all(run_dir: Path, last: Sequence[str] = ()) -> list[str]:
    """Stop every recorded process; the ``last`` names (e.g. the broker) after all the others."""
    recorded = names(run_dir)
    order = [n for n in recorded if n not in last] + [n for n in last if n in recorded]
    return [n for n in order if stop(run_dir, n)]


def _group_members(pid: int) -> list[psutil.Process]:
    try:
        leader = psutil.Process(pid)
        return [leader, *leader.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        os.kill(pid, sig)


def wait_gone(pid: int, timeout_s: float) -> bool:
    """True once ``pid`` no longer runs (used by tests that check `down` left nothing behind)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False
