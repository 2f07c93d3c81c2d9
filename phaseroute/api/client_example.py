"""Submitting one batch with the official ``openai`` SDK, unmodified: what a producer on any
machine does with the API URL and a key (the demo calls ``submit_with_sdk``).

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="sk-pr-...")
    batch_file = client.files.create(file=open("batch.jsonl", "rb"), purpose="batch")
    batch = client.batches.create(input_file_id=batch_file.id, endpoint="/v1/chat/completions",
                                  completion_window="2h", metadata={"priority": "2"})
    ... poll client.batches.retrieve(batch.id) until its status is final, then
    client.files.content(batch.output_file_id).text
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

FINAL = ("completed", "failed", "expired", "cancelled")


def submit_with_sdk(base_url: str, api_key: str, input_path: Path, completion_window: str = "2h",
                    metadata: dict[str, str] | None = None) -> Any:
    """Upload ``input_path`` and create a batch; returns the SDK's Batch object."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=api_key)
    with input_path.open("rb") as fh:
        uploaded = client.files.create(file=fh, purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                 # the SDK's type says only "24h"; phaseroute takes any duration
                                 completion_window=completion_window, metadata=metadata or {})  # type: ignore[arg-type]


def wait_and_download(base_url: str, api_key: str, batch_id: str, timeout_s: float = 600.0,
                      poll_s: float = 2.0) -> tuple[Any, str, str]:
    """Poll until the batch is final; (batch, output file text, error file text)."""
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key=api_key)
    deadline = time.time() + timeout_s
    batch = client.batches.retrieve(batch_id)
    while batch.status not in FINAL:
        if time.time() > deadline:
            raise TimeoutError(f"batch {batch_id} is still {batch.status} after {timeout_s:.0f} s")
        time.sleep(poll_s)
        batch = client.batches.retrieve(batch_id)
    output = client.files.content(batch.output_file_id).text if batch.output_file_id else ""
    errors = client.files.content(batch.error_file_id).text if batch.error_file_id else ""
    return batch, output, errors
