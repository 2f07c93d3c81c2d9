"""A job's output file: one JSON object per line, one line per request, in the shape of an
OpenAI Batch output line (``id``, ``custom_id``, ``response`` or ``error``).

The file is its own state: on open, the custom ids already written are read back, so a
result delivered twice (a worker replayed after a crash, a speculative copy that also
finished) is written once. A line cut short by a crash mid-write is dropped on open and
written again when its result is redelivered.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


class JobOutputFile:
    """Append-only JSONL with exactly one line per custom id."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.written: set[str] = set()
        self._recover()
        self._fh = open(self.path, "a", encoding="utf-8")

    def _recover(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        keep = data if data.endswith(b"\n") or not data else data[: data.rfind(b"\n") + 1]
        if len(keep) != len(data):  # a torn last line from a crash: drop it
            with open(self.path, "r+b") as fh:
                fh.truncate(len(keep))
        for line in keep.decode("utf-8").splitlines():
            if line.strip():
                self.written.add(json.loads(line)["custom_id"])

    def append(self, line: dict[str, Any]) -> bool:
        """Write the line unless its custom id is already there; True if written."""
        custom_id = line["custom_id"]
        if custom_id in self.written:
            return False
        self._fh.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
        self.written.add(custom_id)
        return True

    def sync(self) -> None:
        """Make every appended line durable (called before offsets are committed)."""
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self.sync()
        self._fh.close()


def openai_batch_line(result: dict[str, Any]) -> dict[str, Any]:
    """The output line of one ``result`` record (schemas/avro/result.avsc)."""
    request_id = result["request_id"]
    line_id = "batch_req_" + hashlib.sha256(request_id.encode()).hexdigest()[:24]
    if result["status"] != "OK":
        return {
            "id": line_id, "custom_id": result["custom_id"], "response": None,
            "error": {"code": "request_failed", "message": result.get("error") or "failed"},
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
        }],
        "usage": {
            "prompt_tokens": result["prompt_tokens"],
            "completion_tokens": result["completion_tokens"],
            "total_tokens": result["prompt_tokens"] + result["completion_tokens"],
        },
    }
    return {
        "id": line_id, "custom_id": result["custom_id"],
        "response": {"status_code": 200, "request_id": request_id, "body": body}, "error": None,
    }
