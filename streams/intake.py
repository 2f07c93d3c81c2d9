"""Intake: a submitted job's input, read line by line from the blob store, validated, rendered
and counted, without ever holding the file in memory.

Life of a job's input here (``scan_job_input``, called from a worker thread, never inside
the control plane's event loop):
1. the job's ``input_file`` must be a blob-store key under the tenant's own
   ``tenants/<tenant>/files/`` prefix — a path, a URL or another tenant's key is a job-level
   error naming the value (its content is never read, let alone quoted);
2. the object's size is checked against ``IntakeLimits.max_bytes`` before reading;
3. each line is parsed and validated (``streams/input_lines.py``): OpenAI-style line errors
   (code, line, message, param) are collected up to ``max_errors`` (the count goes on);
   more than ``max_requests`` requests stop the scan with a job-level error;
4. valid lines are rendered (chat template) and counted in chunks with the model's tokenizer;
   each prompt's text is appended to a spool (an unnamed temporary file) and only
   ``(custom_id, tokens, max_tokens)`` stays in memory;
5. the caller admits on ``IntakeScan.prompts``, then streams ``IntakeScan.texts()`` (same order)
   into the request records, and ``close()`` drops the spool.
Inline ``requests`` (small jobs published by the operator CLI) go through the same checks.
"""

from __future__ import annotations

import json
import struct
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple

from phaseroute.infra.blobstore import (
    BlobKeyError,
    BlobNotFoundError,
    BlobStore,
    check_key,
    tenant_prefix,
)
from phaseroute.streams.input_lines import (
    LineError,
    ParsedLine,
    parse_line,
    prompt_budget_error,
)
from phaseroute.streams.model_catalog import ModelInfo

__all__ = ["IntakeError", "IntakeLimits", "IntakeScan", "LineError", "PromptEntry", "scan_job_input"]

_CHUNK = 256  # lines rendered and tokenized together
_LEN = struct.Struct("<I")


class IntakeError(ValueError):
    """The job's input cannot be read at all; the message says why."""


@dataclass(frozen=True)
class IntakeLimits:
    max_requests: int = 50_000
    max_bytes: int = 200 * 1024 * 1024
    max_errors: int = 100
    max_line_bytes: int = 16 * 1024 * 1024


class PromptEntry(NamedTuple):
    custom_id: str
    tokens: int
    max_tokens: int


@dataclass
class IntakeScan:
    """What intake found: the prompts in order, the line errors, or a job-level error."""

    prompts: list[PromptEntry] = field(default_factory=list)
    errors: list[LineError] = field(default_factory=list)
    error_count: int = 0
    job_error: str | None = None
    bytes_read: int = 0
    _spool: IO[bytes] | None = None

    @property
    def ok(self) -> bool:
        return self.job_error is None and self.error_count == 0 and bool(self.prompts)

    def reason(self) -> str:
        """One sentence for a rejection: the job error, or the first line errors and their count."""
        if self.job_error:
            return self.job_error
        if self.error_count:
            shown = "; ".join(f"line {e.line}: {e.message}" for e in self.errors[:3])
            more = f" (and {self.error_count - 3} more)" if self.error_count > 3 else ""
            return f"the input file has {self.error_count} invalid line(s): {shown}{more}"
        return "the job has no requests; submit at least one"

    def texts(self) -> Iterator[str]:
        """The rendered prompt texts, in the order of ``prompts`` (streamed from the spool)."""
        if self._spool is None:
            return
        self._spool.seek(0)
        for _ in range(len(self.prompts)):
            (size,) = _LEN.unpack(self._spool.read(_LEN.size))
            yield self._spool.read(size).decode("utf-8")

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()
            self._spool = None


def scan_job_input(job: dict[str, Any], store: BlobStore | None, model: ModelInfo,
                   limits: IntakeLimits = IntakeLimits()) -> IntakeScan:
    """Validate, render and count every request of a ``job_submitted`` record."""
    scan = IntakeScan()
    if job.get("input_file"):
        try:
            key = input_key(job["input_file"], job["tenant"])
            if store is None:
                raise IntakeError("this control plane has no blob store configured, so it cannot read input files")
            size = store.size(key)
        except (IntakeError, BlobKeyError, ValueError) as exc:
            scan.job_error = str(exc)
            return scan
        except BlobNotFoundError:
            scan.job_error = f"input_file {job['input_file']!r} does not exist in the blob store"
            return scan
        if size > limits.max_bytes:
            scan.job_error = f"input file is {size} bytes; at most {limits.max_bytes} bytes per file"
            return scan
        with store.reader(key) as fh:
            _scan_lines(_file_lines(fh, limits, scan), job, model, limits, scan)
    else:
        lines = (json.dumps({"custom_id": r.get("custom_id") or str(i), "body": _inline_body(r)})
                 for i, r in enumerate(job.get("requests") or []))
        _scan_lines(((n, text) for n, text in enumerate(lines, start=1)), job, model, limits, scan)
    if scan.job_error is None and scan.error_count == 0 and not scan.prompts:
        scan.job_error = "the job has no requests; submit at least one line"
    return scan


def input_key(value: str, tenant: str) -> str:
    """The blob key of a job's input file; only keys under the tenant's own files prefix pass."""
    prefix = tenant_prefix(tenant) + "files/"
    if not isinstance(value, str) or not value.startswith(prefix):
        raise IntakeError(f"input_file {value!r} is not a blob-store key under {prefix!r}: jobs read inputs only from "
                          "their tenant's own files (upload with POST /v1/files)")
    return check_key(value)


def _inline_body(request: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if request.get("messages") is not None:
        body["messages"] = request["messages"]
    if request.get("prompt") is not None:
        body["prompt"] = request["prompt"]
    if request.get("max_tokens") is not None:
        body["max_tokens"] = request["max_tokens"]
    return body


def _file_lines(fh: IO[bytes], limits: IntakeLimits, scan: IntakeScan) -> Iterator[tuple[int, str | None]]:
    """(line number, text) per non-empty line; text None for a line over max_line_bytes."""
    number = 0
    while True:
        raw = fh.readline(limits.max_line_bytes + 1)
        if not raw:
            return
        number += 1
        scan.bytes_read += len(raw)
        if len(raw) > limits.max_line_bytes and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):  # skip the rest of the long line
                raw = fh.readline(limits.max_line_bytes)
                scan.bytes_read += len(raw)
            yield number, None
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield number, f"\x00invalid utf-8 at byte {exc.start}"
            continue
        if text.strip():
            yield number, text


def _scan_lines(lines: Iterable[tuple[int, str | None]], job: dict[str, Any], model: ModelInfo,
                limits: IntakeLimits, scan: IntakeScan) -> None:
    endpoint = (job.get("metadata") or {}).get("endpoint")
    default_max = int(job["sampling"]["max_tokens"])
    seen: set[str] = set()
    chunk: list[ParsedLine] = []
    for number, text in lines:
        if len(scan.prompts) + len(chunk) >= limits.max_requests:
            scan.job_error = (f"the input file has more than {limits.max_requests} requests (line {number}); "
                              f"split it into batches of at most {limits.max_requests}")
            break
        parsed = parse_line(number, text, endpoint, job["model"], default_max, limits.max_line_bytes)
        if isinstance(parsed, LineError):
            _error(scan, parsed, limits)
            continue
        if parsed.custom_id in seen:
            _error(scan, LineError("duplicate_custom_id", number, f"custom_id {parsed.custom_id!r} appears more "
                                   "than once; each request needs a unique custom_id", "custom_id"), limits)
            continue
        seen.add(parsed.custom_id)
        chunk.append(parsed)
        if len(chunk) >= _CHUNK:
            _render(chunk, model, limits, scan)
            chunk = []
    if chunk and scan.job_error is None:
        _render(chunk, model, limits, scan)


def _render(chunk: list[ParsedLine], model: ModelInfo, limits: IntakeLimits, scan: IntakeScan) -> None:
    texts: list[str | None] = []
    with model.lock:  # one chunk at a time per tokenizer; the chunks of jobs taken in together interleave
        for item in chunk:
            try:
                texts.append(model.render(item.prompt, item.messages))
            except Exception as exc:
                _error(scan, LineError("invalid_messages", item.line, f"messages cannot be rendered: {exc}", "body.messages"), limits)
                texts.append(None)
        counts = _count([t for t in texts if t is not None], model)
    spool = scan._spool
    for item, text in zip(chunk, texts):
        if text is None:
            continue
        tokens = counts.pop(0)
        problem = prompt_budget_error(item, tokens, model.context_tokens)
        if problem is not None:
            _error(scan, problem, limits)
            continue
        if scan.error_count:  # once the job is invalid, keep validating but stop spooling
            continue
        if spool is None:
            spool = scan._spool = tempfile.TemporaryFile(prefix="phaseroute-intake-")
        data = text.encode("utf-8")
        spool.write(_LEN.pack(len(data)))
        spool.write(data)
        scan.prompts.append(PromptEntry(item.custom_id, tokens, item.max_tokens))


def _count(texts: list[str], model: ModelInfo) -> list[int]:
    if not texts:
        return []
    if not callable(model.tokenizer):  # a tokenizer without batch encoding: one text at a time
        return [model.count(t) for t in texts]
    return [len(x) for x in model.tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _error(scan: IntakeScan, error: LineError, limits: IntakeLimits) -> None:
    scan.error_count += 1
    if len(scan.errors) < limits.max_errors:
        scan.errors.append(error)
    if scan.prompts:  # an invalid file is rejected whole: no need to keep its prompts
        scan.prompts.clear()
