"""The whole cycle with the official openai SDK, unmodified, pointed at base_url, on the real
stack: Batch API, control plane (Faust), result sink, telemetry service and a real colocated
worker running SmolLM2 on the real broker.

Upload, create, poll, download output and error files (joined on custom_id), list with
pagination, cancel, idempotent creates, an infeasible window and an invalid file answered as
``failed`` with ``errors``; the CLI's submit/status/results/cancel with a key, and its operator
mode saying "not found" for another tenant's or an unknown job; a 50,000-line upload admitted.
The one failed request of the cycle is an injected worker failure: a FAILED ``result`` record
published for it on the results topic, as a worker that gave up would (named as such below).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

from phaseroute.api.kafka_io import publish
from phaseroute.schemas.examples import example
from phaseroute.schemas.ids import request_id

from ..streams.stack_fixture import CLI, LiveStack, profile_pools

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.slow]
POOL = "api-colo"
FINAL = ("completed", "failed", "expired", "cancelled")
key_tenant: dict[str, str] = {}  # key -> tenant name, filled by the stack fixture


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _lines(n: int, prefix: str = "q", max_tokens: int = 8, last_max_tokens: int | None = None) -> bytes:
    return "".join(json.dumps({"custom_id": f"{prefix}{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "smollm2-135m", "max_tokens": last_max_tokens if i == n - 1 and last_max_tokens else max_tokens,
        "messages": [{"role": "user", "content": f"Name one fact about the number {i}."}]}}) + "\n"
        for i in range(n)).encode()


def _completion_lines(n: int, max_tokens: int = 24) -> bytes:
    return "".join(json.dumps({"custom_id": f"p{i}", "method": "POST", "url": "/v1/completions", "body": {
        "model": "smollm2-135m", "max_tokens": max_tokens, "prompt": f"The number {i} is"}}) + "\n"
        for i in range(n)).encode()


def _tenant(name: str, *options: str) -> str:
    proc = subprocess.run([*CLI, "tenants", "add", name, *options], check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def stack(bootstrap: str, tmp_path_factory: pytest.TempPathFactory):
    profile_pools({POOL: "fp32"})
    live = LiveStack(bootstrap, tmp_path_factory.mktemp("api-stack"))
    port = _free_port()
    os.environ["PHASEROUTE_API_PORT"] = str(port)  # the CLI commands below find the API here
    try:
        live.services()
        live.worker(POOL, "both", "fp32", "--max-batch", "1", "--max-decode-batch", "2")
        live.start("api", "api", "--port", str(port))
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while time.time() < deadline:
            live.check()  # a process that exits while the stack starts is a defect: fail with its logs
            try:
                if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"the API at {base} was not healthy within 120 s; logs in {live.logs}")
        live.wait_ready([POOL])  # a batch created before the worker's first heartbeat is rightly refused
        suffix = os.urandom(3).hex()
        names = {"a": f"cycle-a-{suffix}", "b": f"cycle-b-{suffix}"}
        keys = {"a": _tenant(names["a"], "--max-in-flight", "1"), "b": _tenant(names["b"])}
        key_tenant.update({keys[side]: name for side, name in names.items()})
        time.sleep(1.0)  # the API's registry follower reads the new tenants
        yield live, base + "/v1", keys
    finally:
        os.environ.pop("PHASEROUTE_API_PORT", None)
        live.stop_all()


def _sdk(base: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key=key)


def _wait(client: openai.OpenAI, batch_id: str, live: LiveStack, timeout_s: float, until=FINAL):
    deadline = time.time() + timeout_s
    batch = client.batches.retrieve(batch_id)
    while batch.status not in until:
        assert time.time() < deadline, f"batch {batch_id} still {batch.status} after {timeout_s:.0f} s; logs in {live.logs}"
        live.check()
        time.sleep(1.0)
        batch = client.batches.retrieve(batch_id)
    return batch


def _inject_failure(batch_id: str, custom_id: str, tenant: str, bootstrap: str) -> None:
    """A worker that gave up on this request: its FAILED result on the results topic."""
    rid = request_id(batch_id, custom_id)
    record = dict(example("result"), request_id=rid, job_id=batch_id, tenant=tenant, custom_id=custom_id,
                  attempt_id=f"{rid}/final/0", model="smollm2-135m", status="FAILED", output_text="", output_token_ids=[],
                  finish_reason="ERROR", prompt_tokens=1, completion_tokens=0, error="injected worker failure",
                  completed_at=int(time.time() * 1000))
    publish(bootstrap, [("results", batch_id, "result", record)])


def test_upload_create_poll_download_with_an_error_file(stack) -> None:
    live, base, keys = stack
    client = _sdk(base, keys["a"])
    uploaded = client.files.create(file=("cycle.jsonl", _lines(5, last_max_tokens=64)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(_lines(5, last_max_tokens=64))
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="1h",
                                  metadata={"priority": "3", "project": "cycle"})
    assert batch.status == "validating" and batch.metadata["project"] == "cycle"
    assert client.batches.retrieve(batch.id).id == batch.id  # a retrieve before admission works too
    _wait(client, batch.id, live, 120, until=("in_progress", "finalizing", *FINAL))
    # tenant a runs one request at a time and q4 (the longest) is last: once q0 is done every request
    # is known to the control plane, and with the worker paused q4's own result cannot beat the failure
    deadline = time.time() + 120
    running = client.batches.retrieve(batch.id)
    while running.request_counts.completed < 1:
        assert running.status not in FINAL, f"{batch.id} ended {running.status} before a request was done: {running.errors}"
        assert time.time() < deadline, f"no request of {batch.id} done after 120 s; logs in {live.logs}"
        time.sleep(0.1)
        running = client.batches.retrieve(batch.id)
    worker = live.procs[f"worker-{POOL}"]
    worker.send_signal(signal.SIGSTOP)
    try:
        _inject_failure(batch.id, "q4", key_tenant[keys["a"]], live.bootstrap)
    finally:
        worker.send_signal(signal.SIGCONT)
    done = _wait(client, batch.id, live, 400)
    assert done.status == "completed", (done.status, done.errors, done.request_counts)
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (5, 4, 1)
    assert done.usage.output_tokens > 0 and done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
    assert done.created_at <= done.in_progress_at <= done.finalizing_at <= done.completed_at
    output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    by_id = {line["custom_id"]: line for line in output}
    assert sorted(by_id) == ["q0", "q1", "q2", "q3"]
    body = by_id["q0"]["response"]["body"]
    assert by_id["q0"]["response"]["status_code"] == 200 and body["object"] == "chat.completion"
    assert body["choices"][0]["finish_reason"] in ("stop", "length") and body["usage"]["completion_tokens"] > 0
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [("q4", "request_failed")]
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"


def test_list_pages_idempotent_creates_and_cancel(stack) -> None:
    live, base, keys = stack
    client = _sdk(base, keys["b"])
    uploaded = client.files.create(file=("long.jsonl", _lines(20, "c", max_tokens=24)), purpose="batch")
    first = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="2h",
                                  extra_headers={"Idempotency-Key": "cycle-1"})
    again = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="2h",
                                  extra_headers={"Idempotency-Key": "cycle-1"})
    assert again.id == first.id, "a retried create with the same Idempotency-Key is the same batch"
    with pytest.raises(openai.BadRequestError, match="already used with other parameters"):
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="3h",
                              extra_headers={"Idempotency-Key": "cycle-1"})
    prompts = client.files.create(file=("prompts.jsonl", _completion_lines(20)), purpose="batch")
    plain = client.batches.create(input_file_id=prompts.id, endpoint="/v1/completions", completion_window="2h")
    dup = client.batches.create(input_file_id=prompts.id, endpoint="/v1/completions", completion_window="2h")
    assert dup.id == plain.id, "an identical create within the dedup window is the same batch"
    client.batches.cancel(plain.id)
    page = client.batches.list(limit=1)
    assert len(page.data) == 1 and page.has_more and page.data[0].id == plain.id  # newest first
    rest = client.batches.list(limit=1, after=page.data[0].id)
    assert rest.data[0].id == first.id and not rest.has_more
    assert [b.id for b in client.batches.list()] == [plain.id, first.id]  # the SDK's auto-pagination
    _wait(client, first.id, live, 200, until=("in_progress", "finalizing", *FINAL))
    cancelling = client.batches.cancel(first.id)
    assert cancelling.status in ("cancelling", "cancelled")
    final = _wait(client, first.id, live, 200)
    assert final.status == "cancelled" and final.cancelled_at and final.cancelling_at
    assert final.request_counts.completed < 20
    if final.output_file_id:  # lines finished before the cancel stay
        kept = client.files.content(final.output_file_id).text.splitlines()
        assert len(kept) == final.request_counts.completed


def test_infeasible_window_and_invalid_file_fail_with_errors(stack) -> None:
    live, base, keys = stack
    client = _sdk(base, keys["b"])
    big = client.files.create(file=("big.jsonl", _lines(300, "b", max_tokens=256)), purpose="batch")
    rushed = client.batches.create(input_file_id=big.id, endpoint="/v1/chat/completions", completion_window="60s")
    failed = _wait(client, rushed.id, live, 120)
    assert failed.status == "failed" and failed.failed_at
    error = failed.errors.data[0]
    assert error.code == "infeasible_completion_window"
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", error.message), error.message
    bad = client.files.create(file=("bad.jsonl", b'{"custom_id": "x"}\nnot json\n' + _lines(1)), purpose="batch")
    invalid = _wait(client, client.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions",
                                                  completion_window="24h").id, live, 120)
    assert invalid.status == "failed"
    assert [(e.line, e.code) for e in invalid.errors.data] == [(1, "invalid_request"), (2, "invalid_json")]


def test_cli_with_a_key_and_operator_mode_not_found(stack, tmp_path: Path) -> None:
    _, _, keys = stack
    path = tmp_path / "cli.jsonl"
    path.write_bytes(_lines(2, "cli"))
    env = dict(os.environ, PHASEROUTE_API_KEY=keys["a"])
    sub = subprocess.run([*CLI, "submit", str(path), "--deadline", "1h", "--wait"], check=False, capture_output=True, text=True,
                         timeout=400, env=env)
    assert sub.returncode == 0, sub.stderr
    batch_id = sub.stdout.strip().splitlines()[0]
    out = subprocess.run([*CLI, "results", batch_id], check=False, capture_output=True, text=True, timeout=60, env=env)
    assert sorted(json.loads(x)["custom_id"] for x in out.stdout.splitlines()) == ["cli0", "cli1"]
    other = dict(os.environ, PHASEROUTE_API_KEY=keys["b"])
    for command in (["status", batch_id], ["results", batch_id], ["cancel", batch_id]):
        proc = subprocess.run([*CLI, *command], check=False, capture_output=True, text=True, timeout=60, env=other)
        assert proc.returncode == 1 and "No batch found" in proc.stderr, proc.stderr
    operator = dict(os.environ)
    operator.pop("PHASEROUTE_API_KEY", None)
    for command in (["cancel", batch_id, "--tenant", "someone-else"], ["results", batch_id, "--tenant", "someone-else"],
                    ["cancel", "no-such-job", "--tenant", key_tenant[keys["a"]]]):
        proc = subprocess.run([*CLI, *command], check=False, capture_output=True, text=True, timeout=60, env=operator)
        assert proc.returncode == 1 and "not found" in proc.stderr and "cancel sent" not in proc.stderr, proc.stderr
    hint = subprocess.run([*CLI, "submit", str(path), "--deadline", "1h"], check=False, capture_output=True, text=True, timeout=60, env=env)
    assert "phaseroute status" in hint.stderr


def test_cli_survives_a_broker_outage_with_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    path.write_bytes(_lines(1))
    env = dict(os.environ, PHASEROUTE_BOOTSTRAP_SERVERS="127.0.0.1:1")
    env.pop("PHASEROUTE_API_KEY", None)
    for command in (["status", "job-x"], ["submit", str(path), "--tenant", "acme", "--wait"]):
        proc = subprocess.run([*CLI, *command], check=False, capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 1
        assert "did not answer" in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) <= 4, proc.stderr


def test_a_50000_line_upload_is_admitted(stack) -> None:
    live, base, keys = stack
    client = _sdk(base, keys["a"])
    uploaded = client.files.create(file=("fifty.jsonl", _lines(50_000, "f", max_tokens=1)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="30d")
    admitted = _wait(client, batch.id, live, 900, until=("in_progress", "finalizing", *FINAL))
    assert admitted.status == "in_progress", admitted.errors
    assert admitted.request_counts.total == 50_000
    assert client.batches.cancel(batch.id).status == "cancelling"
    began = time.time()
    cancelled = _wait(client, batch.id, live, 900)  # each request still queued gets its batch_cancelled line
    print(f"\n50,000-line batch: cancelled with every line written {time.time() - began:.0f} s after the cancel")
    assert cancelled.status == "cancelled", cancelled
    counts = cancelled.request_counts
    assert counts.completed + counts.failed == 50_000 and counts.failed > 0, counts
    errors = client.files.content(cancelled.error_file_id).text.splitlines()
    assert len(errors) == counts.failed and '"batch_cancelled"' in errors[-1]
