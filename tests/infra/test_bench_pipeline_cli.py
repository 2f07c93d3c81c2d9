"""``phaseroute bench pipeline``: bad set-ups are refused by name before anything starts, and the
output-token count comes from the job's OpenAI Batch output lines. ``bench sink`` runs on a real broker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from phaseroute.cli.bench_pipeline import BENCH_TENANT, _output_tokens, bracket
from phaseroute.cli.main import app
from phaseroute.consumers.output_file import part_name
from phaseroute.infra.blobstore import open_blob_store, output_prefix


def test_an_unknown_setup_is_refused_naming_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["--home", str(tmp_path), "bench", "pipeline", "--setups", "colocated,sideways"])
    assert result.exit_code == 2
    assert "sideways" in result.output and "disaggregated" in result.output
    assert not (tmp_path / "run").exists()  # nothing was started


def test_output_tokens_are_summed_from_the_output_lines(tmp_path: Path) -> None:
    store = open_blob_store(str(tmp_path))
    lines = [{"custom_id": f"p{i}", "response": {"body": {"usage": {"completion_tokens": n}}}} for i, n in enumerate((3, 16, 48))]
    lines.append({"custom_id": "p0", "response": {"body": {"usage": {"completion_tokens": 3}}}})  # a replayed result
    lines.append({"custom_id": "p9", "response": None, "error": {"code": "request_failed", "message": "x"}})
    store.put(f"{output_prefix(BENCH_TENANT, 'job-1')}{part_name(0, 0)}", "".join(json.dumps(line) + "\n" for line in lines).encode())
    assert _output_tokens(str(tmp_path), "job-1") == 67


@pytest.mark.kafka
def test_bench_sink_measures_the_sink_loop_on_a_real_broker(bootstrap: str) -> None:
    # a subprocess: chdb allows one engine per process, and the bench opens its own
    out = subprocess.run([sys.executable, "-m", "phaseroute.cli.main", "bench", "sink", "--json", "--seconds", "3", "--rate", "20"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["poll_rule"] == "wait" and report["records"] >= 20 and report["inserts"] >= 1
    assert 0 < report["loop_share_of_a_core"] < 1 and report["insert_cpu_ms_per_record"] > 0


def test_the_ratio_is_taken_against_the_mean_of_the_engine_runs_around_the_setups() -> None:
    before = {"output_tokens_per_s": 33.6, "output_tokens_per_cpu_s": 20.0}
    after = {"output_tokens_per_s": 42.0, "output_tokens_per_cpu_s": 22.0}
    reference = bracket(before, after)
    assert reference == {"output_tokens_per_s": 37.8, "output_tokens_per_cpu_s": 21.0, "after_over_before": 1.25}
    assert bracket(before, before)["after_over_before"] == 1.0
