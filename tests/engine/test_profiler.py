"""Profiler: grid rows on the tiny model, and the CLI writing them to (embedded) ClickHouse."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from phaseroute.engine.profiler import COLUMNS, QUICK, ProfileGrid, profile_executor
from phaseroute.schemas.enums import Phase

CLI = """
import sys, typer
from typer.testing import CliRunner
from phaseroute.cli.engine_cmds import profile, bench_app
app = typer.Typer()
app.command("profile")(profile)
app.add_typer(bench_app, name="bench")
result = CliRunner().invoke(app, sys.argv[1:])
print(result.output)
if result.exception and not isinstance(result.exception, SystemExit): import traceback; traceback.print_exception(result.exception)
assert result.exit_code == 0, result.output
from phaseroute.config import load_settings
from phaseroute.infra.clickhouse import connect
s = load_settings()
sql = f"SELECT count(), countIf(phase='DECODE'), min(tokens_per_s) > 0 FROM {s.clickhouse_database}.engine_profile"
print("ROWS", connect(s).query(sql).result_rows[0])
"""


def test_grid_rows_have_every_column(tiny: Any) -> None:
    grid = ProfileGrid((1, 2), (8, 16), (1, 3), (16,), decode_steps=2, repeats=1)
    rows = profile_executor(tiny, "tiny-pool", grid)
    assert len(rows) == 4 + 2
    for row in rows:
        assert set(row) == set(COLUMNS)
        assert row["tokens_per_s"] > 0 and row["latency_s"] > 0 and row["kv_bytes_per_token"] == 512
    decode = [r for r in rows if r["phase"] == Phase.DECODE.value]
    assert {r["batch_size"] for r in decode} == {1, 3} and all(r["seq_len"] == 16 for r in decode)
    assert all(r["memory_bytes_per_token"] >= 512 for r in decode)  # allocated KV per live token


def test_cells_beyond_context_are_skipped(tiny: Any) -> None:
    rows = profile_executor(tiny, "p", ProfileGrid((1,), (8, 300), (1,), (300,), decode_steps=1, repeats=1))
    assert [(r["phase"], r["seq_len"]) for r in rows] == [(Phase.PREFILL.value, 8)]


def test_profile_cli_writes_rows_to_clickhouse(tmp_path: Path) -> None:
    env = {**os.environ, "PHASEROUTE_HOME": str(tmp_path), "PHASEROUTE_CLICKHOUSE_URL": ""}
    env.pop("PHASEROUTE_CLICKHOUSE_URL")
    args = ["profile", "--pool", "tiny-cpu", "--model", "tiny-llama", "--threads", "1", "--quick", "--jsonl", str(tmp_path / "rows.jsonl")]
    out = subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    # tiny-llama's context is 256: the QUICK decode cells at context 256 are skipped
    decode = len(QUICK.decode_batches) * len([c for c in QUICK.decode_contexts if c + QUICK.decode_steps + 3 <= 256])
    expected = len(QUICK.prefill_batches) * len(QUICK.prefill_lengths) + decode
    assert f"ROWS ({expected}, {decode}, 1)" in out.stdout
    assert len((tmp_path / "rows.jsonl").read_text().splitlines()) == expected
