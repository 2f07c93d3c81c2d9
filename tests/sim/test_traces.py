"""Trace readers: both real formats, any file in either format, and precise errors."""

from __future__ import annotations

import pytest

from phaseroute.sim.errors import TraceError
from phaseroute.sim.traces import detect_format, read_trace


def test_real_azure_trace(sim_inputs):
    t = read_trace(sim_inputs.azure)
    assert t.format == "azure-csv" and len(t) == 8819
    assert t.arrival_s[0] == 0 and (t.arrival_s[1:] >= t.arrival_s[:-1]).all()
    assert 2000 < t.prompt_tokens.mean() < 2100 and 25 < t.output_tokens.mean() < 31
    assert 3400 < t.span_s < 3500


def test_real_mooncake_trace(sim_inputs):
    t = read_trace(sim_inputs.mooncake)
    assert t.format == "mooncake-jsonl" and len(t) == 12031
    assert t.prompt_tokens.max() == 126195 and t.prefix_blocks.max() > 0
    assert abs(t.span_s - 3536.999) < 1e-6


def test_other_files_in_both_formats(tmp_path):
    csv = tmp_path / "mine.txt"
    csv.write_text("ContextTokens,TIMESTAMP,GeneratedTokens,Extra\n10,5.5,3,x\n20,1.5,0,y\n\n")
    t = read_trace(csv)
    assert t.format == "azure-csv"
    assert list(t.arrival_s) == [0.0, 4.0] and list(t.prompt_tokens) == [20, 10]
    assert list(t.output_tokens) == [1, 3]  # a 0 counts as the one token prefill emits
    jl = tmp_path / "trace.data"
    jl.write_text('{"timestamp": 2000, "input_length": 7, "output_length": 2}\n\n'
                  '{"timestamp": 500, "input_length": 9, "output_length": 4, "hash_ids": [1, 2]}\n')
    t = read_trace(jl)
    assert t.format == "mooncake-jsonl" and list(t.arrival_s) == [0.0, 1.5] and list(t.prefix_blocks) == [2, 0]


@pytest.mark.parametrize("name, text, expected", [
    ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,12,3\n2.0,-4,3\n", "line 3: ContextTokens must be an integer >= 1, got '-4'"),
    ("b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,12,3\n", "line 2: TIMESTAMP 'yesterday'"),
    ("c.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,12\n", "line 2: expected 3 columns"),
    ("d.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,1.5e3x,2\n", "line 2: ContextTokens must be an integer"),
    ("e.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1, "input_length": 5\n', "line 2: not valid JSON"),
    ("f.jsonl", '{"timestamp": 0, "input_length": 5}\n', "line 1: missing field(s) ['output_length']"),
    ("g.jsonl", '{"timestamp": -3, "input_length": 5, "output_length": 1}\n',
     "line 1: timestamp must be a number of milliseconds >= 0, got -3"),
    ("h.jsonl", '{"timestamp": 0, "input_length": "many", "output_length": 1}\n',
     "line 1: input_length must be an integer >= 1, got 'many'"),
    ("i.jsonl", '[1, 2]\n', "line 1: unknown trace format"),
    ("j.csv", "time,prompt,output\n1,2,3\n", "line 1: unknown trace format"),
    ("k.csv", "\n\n", "the file is empty"),
    ("l.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests in the file"),
])
def test_malformed_traces_name_file_line_and_value(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(path) in str(err.value) and expected in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="no such trace file"):
        read_trace(tmp_path / "nope.csv")
    (tmp_path / "x.jsonl").write_text('{"a": 1}')
    assert detect_format(tmp_path / "x.jsonl") == "mooncake-jsonl"
