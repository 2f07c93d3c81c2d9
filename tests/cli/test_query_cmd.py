"""`phaseroute query` output: tables never cut a header or a value; CSV and JSON for programs."""

from __future__ import annotations

import csv
import io

import pytest

from phaseroute.cli import query_cmd

WIDE = {
    "columns": ["pool", "phase", "variant", "batch_size", "seq_len", "tokens_per_s", "memory_bytes_per_token",
                "peak_rss_bytes", "run_id"],
    "rows": [["prefill-fp32", "prefill", "int8-dynamic", 4, 128, 431.25817418, 85481.73913043478, 987654321,
              "b85eea30e2af433190809cff581bd6f2"], ["colo", "decode", "fp32", 1, 64, None, 1.5, 2, "x"]],
}


def test_a_table_into_a_pipe_is_as_wide_as_its_content(capsys: pytest.CaptureFixture[str]) -> None:
    query_cmd.print_table(WIDE, terminal=False)
    out = capsys.readouterr().out
    assert "…" not in out
    for name in WIDE["columns"]:
        assert f" {name} " in out
    for value in ("431.25817418", "85481.73913043478", "b85eea30e2af433190809cff581bd6f2", "NULL"):
        assert value in out
    assert max(len(line) for line in out.splitlines()) > 80


def test_a_table_on_a_narrow_terminal_wraps_cells_and_keeps_headers(capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "150")
    query_cmd.print_table(WIDE, terminal=True)
    out = capsys.readouterr().out
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 150
    header = "".join(out.splitlines()[:3])
    for name in WIDE["columns"]:
        assert name in header, name  # no header is cut (`pha…`)
    assert "b85eea30e2af433190809cff581bd6f2" in out.replace("│", "").replace(" ", "").replace("\n", "")


def test_csv_has_a_header_and_every_value(capsys: pytest.CaptureFixture[str]) -> None:
    query_cmd.write_csv(WIDE)
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert rows[0] == WIDE["columns"]
    assert rows[1] == [str(v) for v in WIDE["rows"][0]]
    assert rows[2][5] == ""  # NULL is an empty field
    assert len(rows) == 3


def test_when_even_the_headers_do_not_fit_rows_become_blocks(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    query_cmd.print_table(WIDE, terminal=True)
    out = capsys.readouterr().out
    assert "…" not in out
    assert "-[ row 1 ]" in out and "-[ row 2 ]" in out
    assert "memory_bytes_per_token | 85481.73913043478" in out
    assert "tokens_per_s           | NULL" in out


def test_values_and_headers_are_text_not_markup(capsys: pytest.CaptureFixture[str]) -> None:
    query_cmd.print_table({"columns": ["tags [x]"], "rows": [["[bold]v[/]"]]}, terminal=False)
    out = capsys.readouterr().out
    assert "tags [x]" in out and "[bold]v[/]" in out
