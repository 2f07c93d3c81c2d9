"""Operator-side job helpers: Kafka and the blob store directly, no API key.

The CLI's ``submit/status/results/cancel`` use the Batch API when given a key; without one
they are operator commands (someone with access to the cluster and the store) built on
these functions. The demo uses them too. Inputs over ``INLINE_LIMIT_BYTES`` are uploaded to the
tenant's prefix in the blob store, never passed as a path.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Any

from phaseroute.api.kafka_io import publish as publish_many
from phaseroute.api.kafka_io import read_latest
from phaseroute.infra.blobstore import file_key, open_blob_store, output_prefix

INLINE_LIMIT_BYTES = 256 * 1024
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")


def parse_deadline(text: str, now: float) -> float:
    """'90s', '30m', '2h', '1d' from now, or an ISO-8601 time; epoch seconds."""
    match = _DURATION.match(text.strip())
    if match:
        return now + float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(f"deadline {text!r} is neither a duration (90s, 30m, 2h, 1d) nor an ISO-8601 time") from None


def _inline_requests(file: Path) -> list[dict[str, Any]]:
    import json

    requests = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            body = obj["body"]
            requests.append({"custom_id": obj["custom_id"], "prompt": body.get("prompt"), "messages": body.get("messages"),
                             "max_tokens": body.get("max_tokens", body.get("max_completion_tokens"))})
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ValueError(f"{file} line {number}: not an OpenAI Batch input line "
                             "({custom_id, method, url, body}); nothing was submitted") from None
    return requests


def job_record(file: Path, tenant: str, priority: int, deadline_s: float, job_id: str, quality: str, model: str,
               max_tokens: int, tolerance: float | None, blob_store_url: str | None = None) -> dict[str, Any]:
    """A ``job_submitted`` record for an OpenAI Batch input file: inline when small, else the
    file is copied to ``tenants/<tenant>/files/`` in the blob store and the record names that key."""
    now_ms = int(time.time() * 1000)
    record: dict[str, Any] = {
        "job_id": job_id, "tenant": tenant, "priority": priority, "submitted_at": now_ms,
        "deadline": int(deadline_s * 1000), "model": model, "quality_tier": quality.upper(),
        "quality_tolerance": tolerance, "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens},
        "requests": [], "input_file": None,
    }
    if file.stat().st_size > INLINE_LIMIT_BYTES:
        if blob_store_url is None:
            from phaseroute.config import settings

            blob_store_url = settings().blob_store
        key = file_key(tenant, f"op-{job_id}.jsonl")
        with file.open("rb") as src, open_blob_store(blob_store_url).writer(key) as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        record["input_file"] = key
        return record
    record["requests"] = _inline_requests(file)
    return record


def publish(bootstrap: str, topic: str, key: str, kind: str, record: dict[str, Any]) -> None:
    publish_many(bootstrap, [(topic, key, kind, record)])


def latest_job_states(bootstrap: str, idle_s: float = 1.0) -> dict[str, dict[str, Any]]:
    """The latest event per job from the compacted ``jobs.state`` topic."""
    return read_latest(bootstrap, "jobs.state", "job_event", lambda e: e["job_id"],
                       lambda new, held: new["at"] >= held["at"])


def job_of_tenant(bootstrap: str, job_id: str, tenant: str | None) -> dict[str, Any]:
    """The job's latest event; ValueError 'not found' for an unknown job or another tenant's
    (the same words, so a tenant cannot learn which ids exist)."""
    event = latest_job_states(bootstrap).get(job_id)
    if event is None or (tenant is not None and event["tenant"] != tenant):
        owner = f" for tenant {tenant!r}" if tenant is not None else ""
        raise ValueError(f"job {job_id!r} not found{owner}")
    return event


def output_lines(blob_store_url: str, tenant: str, job_id: str) -> list[str]:
    """The job's output lines (successes and errors, one per request) as the sink wrote them."""
    import json

    from phaseroute.consumers.output_file import iter_part_lines, unique_lines

    store = open_blob_store(blob_store_url)
    return [json.dumps(line, ensure_ascii=False) for line in unique_lines(iter_part_lines(store, output_prefix(tenant, job_id)))]


def new_job_id() -> str:
    return f"job-{uuid.uuid4().hex[:12]}"
