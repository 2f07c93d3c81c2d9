"""Process records in the run dir: what `up` spawns and what registers itself by hand is stopped
by `down` together, on SIGTERM, and a process that ignores SIGTERM is killed and named."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from phaseroute.infra import processes

# a long-running command in miniature: records itself, stops on SIGTERM (or ignores it)
CHILD = textwrap.dedent("""
    import signal, sys, time
    from pathlib import Path
    from phaseroute.infra import processes
    run_dir, default_name, on_term = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    stop = []
    signal.signal(signal.SIGTERM, signal.SIG_IGN if on_term == "ignore" else (lambda *_: stop.append(1)))
    name = processes.register_self(run_dir, default_name)
    (run_dir / f"{default_name}.ready").write_text(name)
    while not stop:
        time.sleep(0.05)
""")


def _child(run_dir: Path, name: str, on_term: str = "stop") -> list[str]:
    return [sys.executable, "-c", CHILD, str(run_dir), name, on_term]


def _ready(run_dir: Path, name: str, timeout_s: float = 30.0) -> str:
    marker = run_dir / f"{name}.ready"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if marker.exists() and marker.read_text():
            return marker.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{name} did not register within {timeout_s} s")


def test_hand_started_and_spawned_processes_are_stopped_together(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spawned = processes.spawn(run_dir, "worker-a-0", _child(run_dir, "ignored-default"), tmp_path / "a.log")
    by_hand = subprocess.Popen(_child(run_dir, "worker-b-prefill-1"))  # the test's own process group, as in a shell
    assert _ready(run_dir, "ignored-default") == "worker-a-0"  # spawned: keeps the name `up` gave it
    assert _ready(run_dir, "worker-b-prefill-1") == "worker-b-prefill-1"
    assert processes.running(run_dir) == {"worker-a-0": spawned, "worker-b-prefill-1": by_hand.pid}
    spawned_record = processes.read_record(run_dir, "worker-a-0")
    hand_record = processes.read_record(run_dir, "worker-b-prefill-1")
    assert spawned_record is not None and not spawned_record.by_hand and spawned_record.cmd[:2] == [sys.executable, "-c"]
    assert hand_record is not None and hand_record.by_hand

    heard: list[str] = []
    results = processes.stop_many(run_dir, processes.names(run_dir), grace_s=20, on_stopped=lambda s: heard.append(s.name))
    assert {r.name: r.ended for r in results} == {"worker-a-0": processes.Ended.TERMINATED,
                                                 "worker-b-prefill-1": processes.Ended.TERMINATED}
    assert sorted(heard) == ["worker-a-0", "worker-b-prefill-1"]
    assert processes.wait_gone(by_hand.pid, 5) and processes.wait_gone(spawned, 5)
    assert processes.names(run_dir) == [] and not list(run_dir.glob("*.json"))


def test_a_process_that_ignores_sigterm_is_killed_and_said_so(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    stubborn = subprocess.Popen(_child(run_dir, "sink-telemetry-1", on_term="ignore"))
    _ready(run_dir, "sink-telemetry-1")
    started = time.monotonic()
    [result] = processes.stop_many(run_dir, ["sink-telemetry-1"], grace_s=1.0)
    assert result.ended is processes.Ended.KILLED and result.pid == stubborn.pid
    assert 1.0 <= time.monotonic() - started < 10
    assert processes.wait_gone(stubborn.pid, 5)  # (psutil reaped it: Popen.wait cannot see the -9)


def test_a_record_goes_when_its_process_exits_and_a_stale_one_is_cleaned(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = subprocess.Popen(_child(run_dir, "control-7"))
    _ready(run_dir, "control-7")
    proc.terminate()
    assert proc.wait(10) == 0  # its handler stopped the loop: a clean exit
    assert processes.names(run_dir) == []  # atexit removed it
    (run_dir / "worker-x-0.pid").write_text("999999 1.0\n")  # a process killed with -9 left this
    assert processes.running(run_dir) == {}
    assert processes.stop_all(run_dir) == [] and processes.names(run_dir) == []


def test_a_name_held_by_another_live_process_gets_this_pid_appended(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    other = subprocess.Popen(_child(run_dir, "drift"))
    _ready(run_dir, "drift")
    try:
        clash = subprocess.Popen(_child(run_dir, "drift"))
        deadline = time.monotonic() + 30
        while len(processes.running(run_dir)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes.running(run_dir) == {"drift": other.pid, f"drift-{clash.pid}": clash.pid}
    finally:
        processes.stop_all(run_dir, grace_s=10)
    assert not psutil.pid_exists(other.pid) or psutil.Process(other.pid).status() == psutil.STATUS_ZOMBIE


def test_down_waits_as_long_as_a_worker_may_drain_and_close() -> None:
    from phaseroute.consumers.loop import LoopConfig

    assert processes.DRAIN_TIMEOUT_S == LoopConfig("b", "g", "c", {}, "s").drain_timeout_s
    assert processes.DEFAULT_GRACE_S > processes.DRAIN_TIMEOUT_S


def test_process_names_must_be_file_names(tmp_path: Path) -> None:
    for bad in ("", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="must be a non-empty file name"):
            processes.alive_pid(tmp_path, bad)


def test_spawn_records_command_log_and_phaseroute_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PHASEROUTE_TELEMETRY_PORT", "18999")
    run_dir = tmp_path / "run"
    pid = processes.spawn(run_dir, "results", [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "r.log")
    try:
        data = json.loads((run_dir / "results.json").read_text())
        assert data["cmd"][0] == sys.executable and data["log"] == str(tmp_path / "r.log")
        assert data["env"]["PHASEROUTE_TELEMETRY_PORT"] == "18999" and processes.NAME_ENV not in data["env"]
        assert data["by_hand"] is False
    finally:
        assert processes.stop(run_dir, "results", grace_s=5)
    assert processes.wait_gone(pid, 5)


def test_a_hand_started_process_that_exited_unreaped_counts_as_stopped(tmp_path: Path) -> None:
    """A process started by another program stays a zombie until that program waits for it:
    `down` must not wait out the grace time and call it killed."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    child = subprocess.Popen(_child(run_dir, "worker-z-both-1"))  # this test never waits for it until the end
    _ready(run_dir, "worker-z-both-1")
    script = ("import sys; from pathlib import Path; from phaseroute.infra import processes; "
              "[r] = processes.stop_many(Path(sys.argv[1]), ['worker-z-both-1'], grace_s=30); print(r.ended.name, r.seconds)")
    stopper = subprocess.run([sys.executable, "-c", script, str(run_dir)], capture_output=True, text=True, timeout=60)
    ended, seconds = stopper.stdout.split()
    assert ended == "TERMINATED" and float(seconds) < 10, stopper.stdout + stopper.stderr
    assert child.wait(5) == 0


def test_a_stepped_wall_clock_does_not_make_a_running_process_look_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """psutil's create_time is boot time (from the wall clock, read now) plus the start ticks:
    NTP stepping the clock between `up` and `down` moved it and `down` forgot a running worker.
    The record keeps the ticks; a record naming another start (a recycled PID) is still refused."""
    run_dir = tmp_path / "run"
    pid = processes.spawn(run_dir, "worker-c-0", [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "c.log")
    try:
        stamp = (run_dir / "worker-c-0.pid").read_text().split()[1]
        assert stamp.startswith("ticks:")
        real_create_time = psutil.Process.create_time
        monkeypatch.setattr(psutil.Process, "create_time", lambda self: real_create_time(self) + 30.0)
        assert processes.alive_pid(run_dir, "worker-c-0") == pid
        (run_dir / "worker-c-0.pid").write_text(f"{pid} ticks:{int(stamp.removeprefix('ticks:')) - 1}\n")
        assert processes.alive_pid(run_dir, "worker-c-0") is None
        (run_dir / "worker-c-0.pid").write_text(f"{pid} {real_create_time(psutil.Process(pid))}\n")  # an older record
        monkeypatch.undo()
        assert processes.alive_pid(run_dir, "worker-c-0") == pid
    finally:
        psutil.Process(pid).kill()
    assert processes.wait_gone(pid, 5)
