"""A job's output in the blob store: part objects of OpenAI Batch lines, one line per request.

The result sink writes each batch's new lines of a job as one part object under
``tenants/<tenant>/outputs/<job_id>/`` (``part-<partition>-<offset>.jsonl``, the position of the
batch's first result of that job), so any fsspec store works: no appends, whole-object writes
only. The parts are their own state: ``JobOutput`` reads the custom ids already there before
its first write, so a result delivered twice (a replay after a crash, a speculative copy) is
written once. A line cut short (a torn object on a store without atomic writes) is ignored on
read and written again when its result is redelivered.

Lines: a success is ``{id, custom_id, response: {status_code: 200, request_id, body}, error:
null}`` with a ``chat.completion`` body; a request that did not run to an answer is ``{id,
custom_id, response: null, error: {code, message}}`` with the result's ``error_code``
(``request_failed``, ``batch_cancelled``, ``batch_expired``, ...; ``request_failed`` for records
without one). ``is_error_line`` tells them apart for the output and error files.

``JobOutput.tally`` counts the lines a job's output holds (success and error lines, prompt and
completion tokens of the successes: ``OutputTally``). It is counted from the parts on
construction and grows by the fresh lines of each write, so it is exact (one line per custom
id) and the same for a restarted sink; the sink's receipts carry it to the job's counters.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from phaseroute.infra.blobstore import BlobStore, output_prefix

PART_PREFIX = "part-"


def part_name(partition: int, offset: int) -> str:
    return f"{PART_PREFIX}{partition:03d}-{offset:012d}.jsonl"


def iter_part_lines(store: BlobStore, prefix: str) -> Iterator[dict[str, Any]]:
    """Every whole, parseable line of every part under ``prefix``, parts in name order."""
    for key in store.list(prefix):
        if not key.rsplit("/", 1)[-1].startswith(PART_PREFIX):
            continue
        with store.reader(key) as fh:
            for raw in fh:
                if not raw.endswith(b"\n"):
                    break  # a torn tail
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(line, dict) and isinstance(line.get("custom_id"), str):
                    yield line


def unique_lines(lines: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The first line per custom id."""
    seen: set[str] = set()
    for line in lines:
        if line["custom_id"] not in seen:
            seen.add(line["custom_id"])
            yield line


def is_error_line(line: dict[str, Any]) -> bool:
    response = line.get("response")
    return line.get("error") is not None or not isinstance(response, dict) or response.get("status_code") != 200


@dataclass(frozen=True, slots=True)
class OutputTally:
    """Exact counts of a job's output lines (the ``output_written`` receipt's fields of the same names)."""

    lines: int = 0  # distinct custom ids with a line
    ok: int = 0  # success lines
    failed: int = 0  # error lines (is_error_line)
    tokens_in: int = 0  # prompt tokens of the success lines (tokens)
    tokens_out: int = 0  # completion tokens of the success lines (tokens)

    def __add__(self, other: OutputTally) -> OutputTally:
        return OutputTally(self.lines + other.lines, self.ok + other.ok, self.failed + other.failed,
                           self.tokens_in + other.tokens_in, self.tokens_out + other.tokens_out)


def _usage_tokens(line: dict[str, Any], name: str) -> int:
    """``response.body.usage[name]`` of a success line; 0 when it holds no count (a line is
    never refused for its usage: the tally only reports it)."""
    body = line["response"].get("body")
    usage = body.get("usage") if isinstance(body, dict) else None
    value = usage.get(name) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def line_tally(line: dict[str, Any]) -> OutputTally:
    """One line's share of the tally: an error line counts 0 tokens (chat.completion and
    text_completion success lines keep the same ``usage``)."""
    if is_error_line(line):
        return OutputTally(lines=1, failed=1)
    return OutputTally(lines=1, ok=1, tokens_in=_usage_tokens(line, "prompt_tokens"),
                       tokens_out=_usage_tokens(line, "completion_tokens"))


class JobOutput:
    """The lines of one job, as part objects; at most one line per custom id, and their tally."""

    def __init__(self, store: BlobStore, tenant: str, job_id: str) -> None:
        self.store = store
        self.prefix = output_prefix(tenant, job_id)  # BlobKeyError for an id that cannot name a key
        self.written: set[str] = set()
        self._tally = OutputTally()
        for line in unique_lines(iter_part_lines(store, self.prefix)):  # first line per custom id, as the files
            self._tally += line_tally(line)
            self.written.add(line["custom_id"])

    @property
    def tally(self) -> OutputTally:
        """The counts of the lines written so far (``tally.lines == len(written)``)."""
        return self._tally

    def write_part(self, partition: int, offset: int, lines: list[dict[str, Any]]) -> int:
        """Write the lines whose custom id is new as one part object; returns how many.
        The tally grows by those lines only, after the part is stored."""
        fresh = [line for line in unique_lines(lines) if line["custom_id"] not in self.written]
        if not fresh:
            return 0
        added = sum((line_tally(line) for line in fresh), OutputTally())
        data = "".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n" for line in fresh)
        self.store.put(self.prefix + part_name(partition, offset), data.encode("utf-8"))
        self.written.update(line["custom_id"] for line in fresh)
        self._tally += added
        return len(fresh)


def _line_id(request_id: str) -> str:
    return "batch_req_" + hashlib.sha256(request_id.encode()).hexdigest()[:24]


def openai_batch_line(result: dict[str, Any]) -> dict[str, Any]:
    """The output (or error) line of one ``result`` record (schemas/avro/result.avsc)."""
    request_id = result["request_id"]
    if result["status"] != "OK":
        return {
            "id": _line_id(request_id), "custom_id": result["custom_id"], "response": None,
            "error": {"code": result.get("error_code") or "request_failed", "message": result.get("error") or "failed"},
        }
    completed = result["completed_at"]
    created = int(completed.timestamp()) if hasattr(completed, "timestamp") else int(completed) // 1000
    body = {
        "id": "chatcmpl-" + hashlib.sha256((request_id + "/body").encode()).hexdigest()[:24],
        "object": "chat.completion",
        "created": created,
        "model": result["model"],
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": result["output_text"]},
            "finish_reason": str(result["finish_reason"]).lower(),
            "logprobs": None,
        }],
        "usage": {
            "prompt_tokens": result["prompt_tokens"],
            "completion_tokens": result["completion_tokens"],
            "total_tokens": result["prompt_tokens"] + result["completion_tokens"],
        },
    }
    return {
        "id": _line_id(request_id), "custom_id": result["custom_id"],
        "response": {"status_code": 200, "request_id": request_id, "body": body}, "error": None,
    }


def as_text_completion(line: dict[str, Any]) -> dict[str, Any]:
    """A success line with a ``text_completion`` body (for ``/v1/completions`` batches)."""
    body = line["response"]["body"]
    choices = [{"index": c["index"], "text": c["message"]["content"], "finish_reason": c["finish_reason"],
                "logprobs": None} for c in body["choices"]]
    new_body = dict(body, id=body["id"].replace("chatcmpl-", "cmpl-", 1), object="text_completion", choices=choices)
    return dict(line, response=dict(line["response"], body=new_body))
