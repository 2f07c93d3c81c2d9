"""`phaseroute profile` while something holds the embedded ClickHouse fails at once in one line
that says what to do (it was a `ProgrammingError: Unable to open the chdb engine` traceback after
a minute of measuring); `--if-missing` measures a pool only once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "phaseroute.cli.main"]


def _env(home: Path) -> dict[str, str]:
    real_models = Path(os.environ.get("PHASEROUTE_HOME", Path.home() / ".cache" / "phaseroute")) / "models"
    if real_models.exists() and not (home / "models").exists():
        (home / "models").symlink_to(real_models)
    env = {**os.environ, "PHASEROUTE_HOME": str(home)}
    env.pop("PHASEROUTE_CLICKHOUSE_URL", None)
    return env


def test_profile_while_the_chdb_is_held_says_what_to_do_before_measuring(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys, time
        from phaseroute.config import load_settings
        from phaseroute.infra.clickhouse import connect
        client = connect(load_settings(home=sys.argv[1]))  # held while the client lives
        print("held", flush=True)
        time.sleep(120)
    """), str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        proc = subprocess.run([*CLI, "profile", "--pool", "p", "--quick"], env=_env(tmp_path),
                              capture_output=True, text=True, timeout=120)
        took = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait(10)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if line.strip()]
    assert line.startswith("error: the telemetry service (process ") and f"holds the embedded ClickHouse at {tmp_path}" in line
    assert "`phaseroute up --pools ...` profiles each new pool itself" in line and "--no-write --jsonl FILE" in line
    assert took < 30, f"it measured first ({took:.0f} s)"


@pytest.mark.model
@pytest.mark.slow
def test_if_missing_measures_a_pool_once(tmp_path: Path) -> None:
    args = [*CLI, "profile", "--pool", "once", "--variant", "fp32", "--threads", "1", "--quick", "--if-missing"]
    first = subprocess.run(args, env=_env(tmp_path), capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "rows measured" in first.stderr and "written" in first.stderr
    second = subprocess.run(args, env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "pool 'once' (variant 'fp32', 1 threads) already has a cold-start profile" in second.stderr
    other_threads = subprocess.run([*args[:-3], "2", "--quick", "--if-missing", "--no-write"], env=_env(tmp_path),
                                   capture_output=True, text=True, timeout=900)
    assert other_threads.returncode == 0, other_threads.stderr[-2000:]
    assert "rows measured, 0 written" in other_threads.stderr  # another thread count is another profile
