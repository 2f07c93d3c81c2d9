"""PID files for every long-running phaseroute process, so ``phaseroute down`` stops exactly them.

Life of a process record under ``<home>/run``:
1. ``spawn`` (what ``phaseroute up`` uses) starts a command in its own session (process group),
   writes ``<name>.pid`` and ``<name>.json`` (its command line, log and ``PHASEROUTE_*``
   environment, so ``phaseroute restart NAME`` can start it again), and tells the child its
   name through ``PHASEROUTE_PROCESS_NAME``.
2. ``register_self`` is called by every long-running command (``worker``, ``control``,
   ``sink``, the drift monitor) when it starts: a process started by ``up`` finds its name in
   the environment and confirms its record; one started by hand records itself under a name
   of its own (``worker-<pool>-<phase>-<pid>``...). Its record is removed when it exits.
3. ``stop_many`` sends SIGTERM to all the named processes at once (the whole process group of
   a process that leads one, else the process and its children), waits up to the grace time
   for them together, SIGKILLs what is left, and says for each how it ended.

A PID file holds the PID and the process's start in clock ticks since boot (``/proc``'s own
figure, which no change of the wall clock moves; the start's wall time where there is no
``/proc``), so a recycled PID belonging to someone else is never signalled, and a clock stepped
by NTP between ``up`` and ``down`` never makes a running process look gone.
"""

from __future__ import annotations

import atexit
import enum
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

NAME_ENV = "PHASEROUTE_PROCESS_NAME"
# After SIGTERM a worker finishes its work in flight for up to its drain timeout
# (consumers.loop.LoopConfig.drain_timeout_s, 60 s), then commits, sends its last heartbeat and
# closes: `down` waits that long plus a margin before it kills (which loses nothing either).
DRAIN_TIMEOUT_S = 60.0
SHUTDOWN_MARGIN_S = 15.0
DEFAULT_GRACE_S = DRAIN_TIMEOUT_S + SHUTDOWN_MARGIN_S


class Ended(enum.Enum):
    """How ``stop`` left a process."""

    NOT_RUNNING = "not running"
    TERMINATED = "stopped on SIGTERM"
    KILLED = "killed (did not stop on SIGTERM in time)"


@dataclass(frozen=True)
class Stopped:
    name: str
    pid: int | None
    ended: Ended
    seconds: float


@dataclass(frozen=True)
class Record:
    """What ``<name>.json`` says about a process."""

    name: str
    cmd: list[str]
    log: str | None
    env: dict[str, str]
    by_hand: bool


def _pid_file(run_dir: Path, name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"process name {name!r} must be a non-empty file name")
    return run_dir / f"{name}.pid"


def _record_file(run_dir: Path, name: str) -> Path:
    return _pid_file(run_dir, name).with_suffix(".json")


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _phaseroute_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("PHASEROUTE_") and k != NAME_ENV}


def _start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (field 22 of ``/proc/PID/stat``); None
    without ``/proc``. Unlike ``psutil``'s ``create_time`` (boot time read from the wall clock
    now, plus this) it never moves when the clock is stepped."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            after_name = stat.read().rsplit(b")", 1)[1].split()
        return int(after_name[19])
    except (OSError, IndexError, ValueError):
        return None


def _started(pid: int) -> str:
    """The start stamp a PID file keeps: ``ticks:N`` where ``/proc`` has it, else wall seconds."""
    ticks = _start_ticks(pid)
    return f"ticks:{ticks}" if ticks is not None else str(psutil.Process(pid).create_time())


def _same_start(proc: psutil.Process, stamp: str) -> bool:
    if stamp.startswith("ticks:"):
        return _start_ticks(proc.pid) == int(stamp.removeprefix("ticks:"))
    started: float = proc.create_time()
    return abs(started - float(stamp)) <= 1.0  # a record from before ticks were kept


def _write_records(run_dir: Path, name: str, pid: int, record: Record) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    started = _started(pid)
    _write(_record_file(run_dir, name), json.dumps(record.__dict__, indent=1))
    _write(_pid_file(run_dir, name), f"{pid} {started}\n")


def spawn(run_dir: Path, name: str, cmd: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    """Start ``cmd`` detached in its own process group, logging to ``log_path``; record it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    child_env = {**(os.environ if env is None else env), NAME_ENV: name}
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=child_env,
        )
    _write_records(run_dir, name, proc.pid, Record(name, list(cmd), str(log_path), _phaseroute_env(child_env), False))
    return proc.pid


_recorded_as: str | None = None  # the name this process registered itself under


def recorded_name() -> str | None:
    """The name ``register_self`` recorded this process under (None before it did)."""
    return _recorded_as


def register_self(run_dir: Path, default_name: str) -> str:
    """Record this process so ``phaseroute down`` stops it; return the name it is recorded under.

    A process that ``spawn`` started keeps the name it was given; one started by hand uses
    ``default_name`` (make it unique, e.g. with the PID). The record goes when the process exits."""
    given = os.environ.pop(NAME_ENV, None)  # popped: a child of this process is not this process
    name = given or default_name
    holder = alive_pid(run_dir, name)
    if holder is not None and holder != os.getpid():
        name = f"{name}-{os.getpid()}"
    me = psutil.Process()
    record = read_record(run_dir, name) if given else None
    if record is None:
        record = Record(name, me.cmdline(), None, _phaseroute_env(os.environ), given is None)
    _write_records(run_dir, name, me.pid, record)
    atexit.register(unregister_self, run_dir, name)
    global _recorded_as
    _recorded_as = name
    return name


def unregister_self(run_dir: Path, name: str) -> None:
    """Remove this process's record, unless it names another process by now."""
    if alive_pid(run_dir, name) in (os.getpid(), None):
        _pid_file(run_dir, name).unlink(missing_ok=True)
        if not _pid_file(run_dir, name).exists():
            _record_file(run_dir, name).unlink(missing_ok=True)


def read_record(run_dir: Path, name: str) -> Record | None:
    path = _record_file(run_dir, name)
    try:
        data = json.loads(path.read_text())
        return Record(str(data["name"]), [str(c) for c in data["cmd"]], data.get("log"),
                      {str(k): str(v) for k, v in dict(data.get("env") or {}).items()}, bool(data.get("by_hand")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def alive_pid(run_dir: Path, name: str) -> int | None:
    """The PID recorded for ``name`` if that very process still runs (and is not a zombie)."""
    path = _pid_file(run_dir, name)
    if not path.exists():
        return None
    try:
        pid_text, started_text = path.read_text().split()
        proc = psutil.Process(int(pid_text))
        if not _same_start(proc, started_text) or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return int(proc.pid)
    except (ValueError, OSError, psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def names(run_dir: Path) -> list[str]:
    """Names of every process with a PID file under ``run_dir`` (running or not)."""
    return sorted(p.stem for p in run_dir.glob("*.pid")) if run_dir.exists() else []


def running(run_dir: Path) -> dict[str, int]:
    """name -> PID of every recorded process that still runs."""
    found = {n: alive_pid(run_dir, n) for n in names(run_dir)}
    return {n: pid for n, pid in found.items() if pid is not None}


def stop(run_dir: Path, name: str, grace_s: float = DEFAULT_GRACE_S) -> bool:
    """SIGTERM ``name`` (its process group), SIGKILL it after ``grace_s``; True if one was running."""
    return stop_many(run_dir, [name], grace_s)[0].ended is not Ended.NOT_RUNNING


def stop_many(run_dir: Path, which: Sequence[str], grace_s: float = DEFAULT_GRACE_S,
              on_stopped: Callable[[Stopped], None] | None = None) -> list[Stopped]:
    """Stop the named processes together: SIGTERM all, wait up to ``grace_s`` for all, then
    SIGKILL the rest. ``on_stopped`` hears of each as it ends. Records are removed."""
    started = time.monotonic()
    results: dict[str, Stopped] = {}
    members: dict[str, list[psutil.Process]] = {}
    for name in which:
        pid = alive_pid(run_dir, name)
        _forget(run_dir, name)
        if pid is None:
            results[name] = Stopped(name, None, Ended.NOT_RUNNING, 0.0)
            continue
        members[name] = _members(pid)
        _signal(pid, members[name], signal.SIGTERM)
    leader_of = {procs[0].pid: name for name, procs in members.items() if procs}
    every = [p for procs in members.values() for p in procs]

    def ended(proc: psutil.Process) -> None:
        name = leader_of.get(proc.pid)
        if name is not None and name not in results:
            results[name] = Stopped(name, proc.pid, Ended.TERMINATED, time.monotonic() - started)
            if on_stopped:
                on_stopped(results[name])

    alive = _wait_all(every, grace_s, ended)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    _wait_all(alive, 5.0, lambda _p: None)
    for name, procs in members.items():
        if name not in results or any(p in alive for p in procs):
            results[name] = Stopped(name, procs[0].pid if procs else None, Ended.KILLED, time.monotonic() - started)
            if on_stopped:
                on_stopped(results[name])
    return [results[n] for n in which]


def stop_all(run_dir: Path, last: Sequence[str] = (), grace_s: float = DEFAULT_GRACE_S,
             on_stopped: Callable[[Stopped], None] | None = None) -> list[Stopped]:
    """Stop every recorded process, all together; the ``last`` names (e.g. the broker) after
    the others. Only processes that were running are returned."""
    recorded = names(run_dir)
    first = [n for n in recorded if n not in last]
    then = [n for n in last if n in recorded]
    done = stop_many(run_dir, first, grace_s, on_stopped) if first else []
    done += stop_many(run_dir, then, grace_s, on_stopped) if then else []
    return [s for s in done if s.ended is not Ended.NOT_RUNNING]


def _gone(proc: psutil.Process) -> bool:
    """Exited: no such process, or a zombie its parent has not reaped yet (a process started
    by hand from another program stays a zombie until that program waits for it)."""
    try:
        return bool(proc.status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _wait_all(procs: list[psutil.Process], timeout_s: float, on_gone: Callable[[psutil.Process], None]) -> list[psutil.Process]:
    """Wait until every process is gone or ``timeout_s`` passed; return those still running."""
    waiting = list(procs)
    deadline = time.monotonic() + timeout_s
    while waiting:
        for proc in [p for p in waiting if _gone(p)]:
            waiting.remove(proc)
            on_gone(proc)
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return waiting


def _forget(run_dir: Path, name: str) -> None:
    _pid_file(run_dir, name).unlink(missing_ok=True)
    _record_file(run_dir, name).unlink(missing_ok=True)


def _members(pid: int) -> list[psutil.Process]:
    try:
        leader = psutil.Process(pid)
        return [leader, *leader.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _signal(pid: int, members: list[psutil.Process], sig: signal.Signals) -> None:
    """The whole group of a process that leads one (as ``spawn`` starts them); a process started
    by hand in a shell's job group gets the signal itself, with its children."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
            return
    except (ProcessLookupError, PermissionError):
        pass
    for proc in members:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def wait_gone(pid: int, timeout_s: float) -> bool:
    """True once ``pid`` no longer runs (used by tests that check `down` left nothing behind)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False
