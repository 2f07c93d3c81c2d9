"""``phaseroute bench pipeline``: bad set-ups are refused by name before anything starts, and the
output-token count comes from the job's OpenAI Batch output lines."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from phaseroute.cli.bench_pipeline import _output_tokens
from phaseroute.cli.main import app


def test_an_unknown_setup_is_refused_naming_it(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["--home", str(tmp_path), "bench", "pipeline", "--setups", "colocated,sideways"])
    assert result.exit_code == 2
    assert "sideways" in result.output and "disaggregated" in result.output
    assert not (tmp_path / "run").exists()  # nothing was started


def test_output_tokens_are_summed_from_the_output_lines(tmp_path: Path) -> None:
    path = tmp_path / "job.jsonl"
    lines = [{"custom_id": f"p{i}", "response": {"body": {"usage": {"completion_tokens": n}}}} for i, n in enumerate((3, 16, 48))]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + "\n")
    assert _output_tokens(path) == 67
