"""Trace readers: request arrivals with prompt and output token counts, from real traces.

Two formats, detected from the content (not the file name):

- CSV with a header naming ``TIMESTAMP``, ``ContextTokens`` and ``GeneratedTokens`` (the
  Azure LLM inference traces, 2023 and 2024). TIMESTAMP is an ISO date-time
  (``2023-11-16 18:17:03.9799600``) or a number of seconds.
- JSONL, one object per line with ``timestamp`` (milliseconds), ``input_length``,
  ``output_length`` and optionally ``hash_ids`` (the Mooncake traces).

Every malformed value raises TraceError naming the file, the line number and the value.
Arrivals are returned in seconds relative to the first request, sorted (stable).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from phaseroute.sim.errors import TraceError

CSV_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
JSONL_FIELDS = ("timestamp", "input_length", "output_length")


@dataclass(frozen=True)
class Trace:
    """Columns of one trace; row i is one request."""

    source: str
    format: str              # "azure-csv" | "mooncake-jsonl"
    arrival_s: np.ndarray    # float64, seconds from the first arrival, non-decreasing
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1 (a 0 in the file counts as 1: prefill emits one token)
    prefix_blocks: np.ndarray  # int64: number of hash ids (Mooncake) or 0

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def span_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0


def detect_format(path: Path) -> str:
    """``azure-csv`` or ``mooncake-jsonl`` from the first non-empty line."""
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            text = line.strip()
            if not text:
                continue
            if text.startswith("{"):
                return "mooncake-jsonl"
            header = [c.strip().strip('"').lower() for c in text.split(",")]
            if all(c.lower() in header for c in CSV_COLUMNS):
                return "azure-csv"
            raise TraceError(
                f"{path}: line 1: unknown trace format: expected a CSV header with columns "
                f"{', '.join(CSV_COLUMNS)} or JSONL objects with {', '.join(JSONL_FIELDS)}; got {text[:80]!r}"
            )
    raise TraceError(f"{path}: the file is empty")


def read_trace(path: str | Path) -> Trace:
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    fmt = detect_format(path)
    rows = _read_csv(path) if fmt == "azure-csv" else _read_jsonl(path)
    if not rows:
        raise TraceError(f"{path}: no requests in the file")
    arr = np.array(rows, dtype=np.float64)
    order = np.argsort(arr[:, 0], kind="stable")
    arr = arr[order]
    return Trace(
        source=str(path), format=fmt,
        arrival_s=arr[:, 0] - arr[0, 0],
        prompt_tokens=arr[:, 1].astype(np.int64),
        output_tokens=np.maximum(arr[:, 2].astype(np.int64), 1),
        prefix_blocks=arr[:, 3].astype(np.int64),
    )


def _count(value: object, path: Path, lineno: int, name: str, minimum: int) -> int:
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            pass
    if number is None or number < minimum:
        raise TraceError(f"{path}: line {lineno}: {name} must be an integer >= {minimum}, got {value!r}")
    return number


def _seconds(value: str, path: Path, lineno: int) -> float:
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        try:
            return datetime.fromisoformat(text).timestamp()
        except ValueError:
            raise TraceError(
                f"{path}: line {lineno}: TIMESTAMP {value!r} is neither an ISO date-time nor a number of seconds"
            ) from None
    if number != number or number in (float("inf"), float("-inf")):
        raise TraceError(f"{path}: line {lineno}: TIMESTAMP {value!r} is not finite")
    return number


def _read_csv(path: Path) -> list[tuple[float, int, int, int]]:
    rows = []
    with path.open("r", newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        names = [h.strip().strip('"').lower() for h in header]
        idx = [names.index(c.lower()) for c in CSV_COLUMNS]
        for lineno, rec in enumerate(reader, start=2):
            if not rec or all(not c.strip() for c in rec):
                continue
            if len(rec) < len(names):
                raise TraceError(f"{path}: line {lineno}: expected {len(names)} columns, got {len(rec)}: {rec!r}")
            rows.append((
                _seconds(rec[idx[0]], path, lineno),
                _count(rec[idx[1]], path, lineno, "ContextTokens", 1),
                _count(rec[idx[2]], path, lineno, "GeneratedTokens", 0),
                0,
            ))
    return rows


def _read_jsonl(path: Path) -> list[tuple[float, int, int, int]]:
    rows = []
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}: line {lineno}: not valid JSON ({exc.msg}): {line.strip()[:80]!r}") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{path}: line {lineno}: expected a JSON object, got {line.strip()[:80]!r}")
            missing = [f for f in JSONL_FIELDS if f not in obj]
            if missing:
                raise TraceError(f"{path}: line {lineno}: missing field(s) {missing} in {line.strip()[:80]!r}")
            ts = obj["timestamp"]
            if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts != ts or ts < 0:
                raise TraceError(f"{path}: line {lineno}: timestamp must be a number of milliseconds >= 0, got {ts!r}")
            hashes = obj.get("hash_ids", [])
            if not isinstance(hashes, list):
                raise TraceError(f"{path}: line {lineno}: hash_ids must be a list, got {hashes!r}")
            rows.append((
                float(ts) / 1000.0,
                _count(obj["input_length"], path, lineno, "input_length", 1),
                _count(obj["output_length"], path, lineno, "output_length", 0),
                len(hashes),
            ))
    return rows
