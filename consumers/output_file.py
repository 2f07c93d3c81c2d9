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
without one). ``split_lines`` tells them apart for the output and error files.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
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


class JobOutput:
    """The lines of one job, as part objects; at most one line per custom id."""

    def __init__(self, store: BlobStore, tenant: str, job_id: str) -> None:
        self.store = store
        self.prefix = output_prefix(tenant, job_id)  # BlobKeyError for an id that cannot name a key
        self.written: set[str] = {line["custom_id"] for line in iter_part_lines(store, self.prefix)}

    def write_part(self, partition: int, offset: int, lines: list[dict[str, Any]]) -> int:
        """Write the lines whose custom id is new as one part object; returns how many."""
        fresh: list[dict[str, Any]] = []
        for line in lines:
            if line["custom_id"] not in self.written and line["custom_id"] not in {f["custom_id"] for f in fresh}:
                fresh.append(line)
        if not fresh:
            return 0
        data = "".join(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n" for line in fresh)
        self.store.put(self.prefix + part_name(partition, offset), data.encode("utf-8"))
        self.written.update(line["custom_id"] for line in fresh)
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
