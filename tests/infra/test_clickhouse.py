"""Embedded ClickHouse (chdb through clickhouse-connect): DDL is idempotent and data survives restarts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

WRITE = """
import datetime, sys
from phaseroute.config import load_settings
from phaseroute.infra import clickhouse
cfg = load_settings(home=sys.argv[1])
client = clickhouse.connect(cfg)
print(clickhouse.apply_ddl(client, cfg.clickhouse_database), clickhouse.apply_ddl(client, cfg.clickhouse_database))
at = datetime.datetime(2026, 11, 30, 12, 0, 0, tzinfo=datetime.timezone.utc)
rows = [dict(batch_id=f"b{i}", pool="fp32", worker_id="w1", model="smollm2-135m", phase="DECODE", variant="fp32",
             batch_size=8, tokens_in=100 + i, tokens_out=64, seq_len_mean=120.0, seq_len_max=160, queue_wait_s=0.1,
             exec_time_s=0.5, steps=64, step_latency_s=0.007, kv_bytes=0, kv_transfer_s=0.0, source_pool=None,
             status="OK", error_class=None, at=at) for i in range(3)]
cols = list(rows[0])
print(clickhouse.insert_rows(client, f"{cfg.clickhouse_database}.phase_telemetry", rows, cols))
"""

READ = """
import json, sys
from phaseroute.config import load_settings
from phaseroute.infra import clickhouse
cfg = load_settings(home=sys.argv[1])
client = clickhouse.connect(cfg)
rows = client.query("SELECT batch_id, tokens_in, phase, toString(at) FROM phaseroute.phase_telemetry ORDER BY batch_id").result_rows
print(json.dumps([list(r) for r in rows]))
"""


def _run(code: str, home: Path) -> str:
    proc = subprocess.run([sys.executable, "-c", code, str(home)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_telemetry_rows_survive_a_process_restart(tmp_path: Path) -> None:
    assert _run(WRITE, tmp_path) == "3"
    rows = json.loads(_run(READ, tmp_path))  # a new process on the same data path
    assert rows == [
        ["b0", 100, "DECODE", "2026-11-30 12:00:00.000"],
        ["b1", 101, "DECODE", "2026-11-30 12:00:00.000"],
        ["b2", 102, "DECODE", "2026-11-30 12:00:00.000"],
    ]


def test_ddl_is_idempotent(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", WRITE, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.split()[:2]
    assert first == second and int(first) >= 2
