"""The control plane live: Faust agents on the real broker with real workers and the real model.

- a job submitted through the CLI completes with exactly one result per request;
- the control-plane process is killed (SIGKILL) mid-run and restarted: its tables are rebuilt
  from their changelogs and the job still completes with exactly one result per request.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections import Counter
from pathlib import Path

import pytest

from phaseroute.config import settings

from .stack_fixture import CLI, LiveStack, profile_pools

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.slow]
POOL = "itest-colo"


def _input_file(path: Path, n: int, max_tokens: int = 16) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
                "model": "smollm2-135m", "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": f"Give one fact about the number {i}."}]}}) + "\n")
    return path


def _output_ids(job_id: str) -> Counter:
    """Custom ids of the job's lines in the blob store (the sink's parts, every line written)."""
    from phaseroute.consumers.output_file import iter_part_lines
    from phaseroute.infra.blobstore import open_blob_store, output_prefix

    store = open_blob_store(settings().blob_store)
    return Counter(line["custom_id"] for line in iter_part_lines(store, output_prefix("acme", job_id)))


@pytest.fixture(scope="module")
def live(bootstrap: str, tmp_path_factory: pytest.TempPathFactory):
    profile_pools({POOL: "fp32"})
    stack = LiveStack(bootstrap, tmp_path_factory.mktemp("live-stack"))
    try:
        stack.services()
        stack.worker(POOL, "both", "fp32", "--max-decode-batch", "8")
        stack.wait_ready([POOL])
        yield stack
    finally:
        stack.stop_all()


def _submit(tmp_path: Path, job_id: str, n: int) -> None:
    proc = subprocess.run([*CLI, "submit", str(_input_file(tmp_path / f"{job_id}.jsonl", n)), "--tenant", "acme",
                           "--deadline", "30m", "--job-id", job_id], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_submitted_job_completes_with_one_result_per_request(live: LiveStack, tmp_path: Path) -> None:
    job_id = f"live-{uuid.uuid4().hex[:8]}"
    _submit(tmp_path, job_id, 12)
    event = live.wait_job(job_id, 300)
    assert event["state"] == "COMPLETED" and event["requests_done"] == 12
    assert _output_ids(job_id) == Counter({f"q{i}": 1 for i in range(12)})
    status = subprocess.run([*CLI, "status", job_id, "--json"], capture_output=True, text=True, timeout=60)
    assert json.loads(status.stdout)["state"] == "COMPLETED"


def test_control_plane_killed_mid_run_loses_no_job_and_no_request(live: LiveStack, tmp_path: Path) -> None:
    job_id = f"restart-{uuid.uuid4().hex[:8]}"
    _submit(tmp_path, job_id, 30)
    live.wait_job(job_id, 300, final=False, done_at_least=5)
    live.stop("control", kill=True)  # SIGKILL: no graceful shutdown, no flushing
    live.start("control", "control")
    event = live.wait_job(job_id, 400)
    assert event["state"] == "COMPLETED"
    assert event["requests_done"] == 30, "the rebuilt job table counted a request twice or lost one"
    assert _output_ids(job_id) == Counter({f"q{i}": 1 for i in range(30)})
