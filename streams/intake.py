"""Turning a submitted job into prompts: inline requests, or an OpenAI Batch input file.

Each line of an input file is ``{"custom_id": ..., "method": "POST", "url":
"/v1/chat/completions", "body": {"model": ..., "messages": [...], "max_tokens": N}}`` (or a
``prompt`` for completions). Anything malformed is an ``IntakeError`` naming the file, the line
and what is wrong, so the job is rejected with a reason the user can act on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phaseroute.streams.model_catalog import ModelInfo


class IntakeError(ValueError):
    """The job's requests cannot be read; the message says where and why."""


@dataclass(frozen=True)
class PromptItem:
    custom_id: str
    text: str  # full model input (chat template applied)
    tokens: int
    max_tokens: int


def read_input_file(path: str) -> list[dict[str, Any]]:
    """Requests from an OpenAI Batch input JSONL file, as ``{custom_id, prompt, messages, max_tokens}``."""
    file = Path(path.removeprefix("file://"))
    if not file.is_file():
        raise IntakeError(f"input file {path!r} does not exist or is not a file")
    items = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise IntakeError(f"{path} line {number}: not JSON ({exc.msg} at column {exc.colno})") from None
        body = obj.get("body") if isinstance(obj, dict) else None
        if not isinstance(body, dict) or not isinstance(obj.get("custom_id"), str):
            raise IntakeError(f"{path} line {number}: needs a string 'custom_id' and an object 'body'")
        messages, prompt = body.get("messages"), body.get("prompt")
        if messages is None and not isinstance(prompt, str):
            raise IntakeError(f"{path} line {number}: body needs 'messages' or a string 'prompt'")
        if messages is not None and (not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages)):
            raise IntakeError(f"{path} line {number}: 'messages' must be a list of {{role, content}} strings")
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise IntakeError(f"{path} line {number}: max_tokens must be a positive integer, got {max_tokens!r}")
        items.append({"custom_id": obj["custom_id"], "prompt": prompt, "messages": messages, "max_tokens": max_tokens})
    return items


def prompts_of(job: dict[str, Any], model: ModelInfo) -> list[PromptItem]:
    """Every request of a ``job_submitted`` record, rendered and counted."""
    raw = read_input_file(job["input_file"]) if job.get("input_file") else list(job.get("requests") or [])
    default_max = int(job["sampling"]["max_tokens"])
    seen: set[str] = set()
    items = []
    for index, req in enumerate(raw):
        custom_id = req.get("custom_id") or str(index)
        if custom_id in seen:
            raise IntakeError(f"custom_id {custom_id!r} appears twice in job {job['job_id']!r}; each must be unique")
        seen.add(custom_id)
        try:
            text = model.render(req.get("prompt"), req.get("messages"))
        except ValueError as exc:
            raise IntakeError(f"request {custom_id!r}: {exc}") from None
        items.append(PromptItem(custom_id, text, model.count(text), int(req.get("max_tokens") or default_max)))
    return items
