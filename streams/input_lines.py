"""One line of an OpenAI Batch input file, checked: a ``ParsedLine`` or a ``LineError``.

A line is ``{"custom_id": ..., "method": "POST", "url": "/v1/chat/completions", "body":
{"model": ..., "messages": [...], "max_tokens": N}}`` (``/v1/completions`` takes a string
``prompt``). Error codes follow OpenAI's batch validation errors where one exists
(``invalid_json``, ``invalid_request``, ``duplicate_custom_id``, ``mismatched_model``,
``invalid_url``, ...); every message names the bad value and what would be accepted. Pure:
no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from phaseroute.schemas.ids import custom_id_problem

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
UNSUPPORTED = ("n", "logprobs", "top_logprobs", "tools", "functions", "response_format", "stream")


@dataclass(frozen=True)
class LineError:
    """One invalid line, in the shape of OpenAI's ``errors.data[]`` entries."""

    code: str
    line: int
    message: str
    param: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "line": self.line, "message": self.message, "param": self.param}


@dataclass(frozen=True)
class ParsedLine:
    line: int
    custom_id: str
    prompt: str | None
    messages: list[dict[str, str]] | None
    max_tokens: int
    max_tokens_given: bool


def parse_line(number: int, text: str | None, endpoint: str | None, model: str, default_max: int,
               max_line_bytes: int) -> ParsedLine | LineError:
    if text is None:
        return LineError("line_too_long", number, f"the line is longer than {max_line_bytes} bytes")
    if text.startswith("\x00"):
        return LineError("invalid_json", number, f"the line is not UTF-8 text ({text[1:]})")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return LineError("invalid_json", number, f"not valid JSON: {exc.msg} at column {exc.colno}")
    if not isinstance(obj, dict):
        return LineError("invalid_request", number, f"each line must be a JSON object, got {type(obj).__name__}")
    problem = custom_id_problem(obj.get("custom_id"))
    if problem:
        return LineError("invalid_custom_id", number, problem, "custom_id")
    if obj.get("method", "POST") != "POST":
        return LineError("invalid_method", number, f"method {obj.get('method')!r} must be 'POST'", "method")
    url = obj.get("url", endpoint)
    if endpoint is not None and url != endpoint:
        return LineError("invalid_url", number, f"url {url!r} must be the batch's endpoint {endpoint!r}", "url")
    if url is not None and url not in ENDPOINTS:
        return LineError("invalid_url", number, f"url {url!r} must be one of {list(ENDPOINTS)}", "url")
    body = obj.get("body")
    if not isinstance(body, dict):
        return LineError("invalid_request", number, "'body' must be a JSON object", "body")
    return _body(number, obj["custom_id"], body, url, model, default_max)


def _body(number: int, custom_id: str, body: dict[str, Any], url: str | None, model: str,
          default_max: int) -> ParsedLine | LineError:
    if "model" in body and body["model"] != model:
        return LineError("mismatched_model", number, f"body.model {body['model']!r} differs from the batch's model "
                         f"{model!r}; every request of a batch uses one model", "body.model")
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, 1 if name == "n" else None):
            return LineError("unsupported_parameter", number, f"body.{name}={body[name]!r} is not supported", f"body.{name}")
    temperature = body.get("temperature", 0)
    if not isinstance(temperature, (int, float)) or temperature != 0:
        return LineError("unsupported_parameter", number, f"body.temperature={temperature!r}: this deployment decodes "
                         "greedily only; use 0 or leave it out", "body.temperature")
    messages, prompt = body.get("messages"), body.get("prompt")
    if url == "/v1/completions" or (url is None and prompt is not None and messages is None):
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str) or not prompt:
            return LineError("invalid_request", number, "body.prompt must be a non-empty string", "body.prompt")
        messages = None
    else:
        checked = _messages(messages)
        if isinstance(checked, str):
            return LineError("invalid_request", number, checked, "body.messages")
        messages, prompt = checked, None
    given = "max_tokens" in body or "max_completion_tokens" in body
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", default_max))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return LineError("invalid_max_tokens", number, f"max_tokens must be a positive integer, got {max_tokens!r}",
                         "body.max_tokens")
    return ParsedLine(number, custom_id, prompt, messages, max_tokens, given)


def _messages(messages: Any) -> list[dict[str, str]] | str:
    if not isinstance(messages, list) or not messages:
        return "body.messages must be a non-empty list of {role, content} objects"
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return f"body.messages[{i}] must be an object with a string 'role'"
        content = message.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                return f"body.messages[{i}].content: only text parts ({{type: text, text}}) are supported"
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            return f"body.messages[{i}].content must be a string or a list of text parts"
        out.append({"role": message["role"], "content": content})
    return out


def prompt_budget_error(line: ParsedLine, prompt_tokens: int, context_tokens: int) -> LineError | None:
    """The line's prompt plus max_tokens must fit the model's context; the message gives the limit."""
    if prompt_tokens >= context_tokens:
        return LineError("prompt_too_long", line.line, f"the prompt is {prompt_tokens} tokens; the model's context is "
                         f"{context_tokens} tokens", "body.messages" if line.messages is not None else "body.prompt")
    if prompt_tokens + line.max_tokens > context_tokens:
        room = context_tokens - prompt_tokens
        return LineError("invalid_max_tokens", line.line, f"max_tokens {line.max_tokens} with a {prompt_tokens}-token "
                         f"prompt exceeds the model's context of {context_tokens} tokens; at most {room} here",
                         "body.max_tokens")
    return None
