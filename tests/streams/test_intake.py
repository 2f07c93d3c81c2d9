"""Intake with the real SmolLM2 tokenizer and a real blob store: OpenAI-style line errors
(code, line, message, param; capped, counted), the limits, inputs only from the tenant's own
prefix (the /etc/passwd hole), and prompts spooled and streamed back in order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phaseroute.config import settings
from phaseroute.infra.blobstore import BlobStore, file_key
from phaseroute.streams.intake import IntakeLimits, scan_job_input
from phaseroute.streams.model_catalog import load_model_info

pytestmark = pytest.mark.model
MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def model_info():
    return load_model_info(MODEL, settings().model_cache)


@pytest.fixture()
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(str(tmp_path / "blobs"))


def _line(i: int, **body) -> str:
    base = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": f"Question {i}?"}]}
    return json.dumps({"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions", "body": {**base, **body}})


def _job(store: BlobStore, lines: list[str], tenant: str = "acme") -> dict:
    store.put(file_key(tenant, "file-in"), ("\n".join(lines) + "\n").encode())
    return {"job_id": "j1", "tenant": tenant, "model": MODEL, "input_file": f"tenants/{tenant}/files/file-in",
            "requests": [], "sampling": {"max_tokens": 64}, "metadata": {"endpoint": "/v1/chat/completions"}}


def test_valid_lines_are_counted_and_streamed_back_in_order(store: BlobStore, model_info) -> None:
    scan = scan_job_input(_job(store, [_line(i) for i in range(600)]), store, model_info)  # > one render chunk
    assert scan.ok and [p.custom_id for p in scan.prompts] == [f"q{i}" for i in range(600)]
    texts = list(scan.texts())
    assert len(texts) == 600 and "Question 599?" in texts[-1] and "Question 0?" in texts[0]
    assert scan.prompts[0].tokens == model_info.count(texts[0]) and scan.prompts[0].max_tokens == 8
    scan.close()


def test_invalid_lines_are_all_listed_with_code_line_and_param(store: BlobStore, model_info) -> None:
    lines = [_line(0), "{not json", _line(0), json.dumps({"custom_id": "x", "body": "nope"}),
             _line(4, model="gpt-4o"), _line(5, max_tokens=10**9), _line(6, temperature=0.7),
             json.dumps({"custom_id": "c" * 600, "body": {}}), _line(8, messages=[{"role": "user", "content": [
                 {"type": "image_url", "image_url": {"url": "x"}}]}]),
             json.dumps({"custom_id": "u", "url": "/v1/embeddings", "body": {}}), _line(10)]
    scan = scan_job_input(_job(store, lines), store, model_info)
    got = {(e.line, e.code, e.param) for e in scan.errors}
    assert got == {(2, "invalid_json", None), (3, "duplicate_custom_id", "custom_id"), (4, "invalid_request", "body"),
                   (5, "mismatched_model", "body.model"), (6, "invalid_max_tokens", "body.max_tokens"),
                   (7, "unsupported_parameter", "body.temperature"), (8, "invalid_custom_id", "custom_id"),
                   (9, "invalid_request", "body.messages"), (10, "invalid_url", "url")}
    assert scan.error_count == 9 and not scan.ok and scan.prompts == []
    too_big = next(e for e in scan.errors if e.line == 6)
    assert "context of 8192 tokens" in too_big.message and "at most" in too_big.message
    assert "9 invalid line(s)" in scan.reason()


def test_line_errors_are_capped_but_counted(store: BlobStore, model_info) -> None:
    scan = scan_job_input(_job(store, ["{bad"] * 30), store, model_info, IntakeLimits(max_errors=5))
    assert len(scan.errors) == 5 and scan.error_count == 30


def test_limits_of_requests_and_bytes(store: BlobStore, model_info) -> None:
    job = _job(store, [_line(i) for i in range(11)])
    assert "more than 10 requests" in scan_job_input(job, store, model_info, IntakeLimits(max_requests=10)).job_error
    assert "at most 100 bytes" in scan_job_input(job, store, model_info, IntakeLimits(max_bytes=100)).job_error


@pytest.mark.parametrize("value", ["/etc/passwd", "file:///etc/passwd", "tenants/acme/files/../../../etc/passwd",
                                   "tenants/globex/files/file-in", "s3://bucket/x", "tenants/acme/batches/b.json"])
def test_inputs_come_only_from_the_tenants_own_files(store: BlobStore, model_info, value: str) -> None:
    store.put(file_key("globex", "file-in"), (_line(0) + "\n").encode())
    job = dict(_job(store, [_line(0)]), input_file=value)
    scan = scan_job_input(job, store, model_info)
    assert scan.job_error is not None and repr(value) in scan.job_error and not scan.prompts
    assert "root:" not in scan.job_error


def test_a_missing_file_and_an_empty_file_are_job_errors(store: BlobStore, model_info) -> None:
    job = dict(_job(store, []), input_file="tenants/acme/files/file-gone")
    assert "does not exist" in scan_job_input(job, store, model_info).job_error
    store.put(file_key("acme", "file-empty"), b"\n\n")
    job = dict(job, input_file="tenants/acme/files/file-empty")
    assert "no requests" in scan_job_input(job, store, model_info).job_error


def test_jobs_taken_in_at_once_share_the_tokenizer_and_count_as_alone(store: BlobStore, model_info) -> None:
    """The control plane takes in several jobs at once (threads over one tokenizer): each gets the
    counts it gets alone, and none fails on the tokenizer being in use by another."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = []
    for n, tenant in enumerate(("acme", "globex", "initech", "umbrella")):
        lines = [_line(i, messages=[{"role": "user", "content": f"Question {i} of {tenant}, " * (1 + i % 7)}])
                 for i in range(300 + 100 * n)]
        jobs.append(_job(store, lines, tenant))
    alone = []
    for job in jobs:
        scan = scan_job_input(job, store, model_info)
        alone.append([(p.custom_id, p.tokens) for p in scan.prompts])
        scan.close()
    with ThreadPoolExecutor(max_workers=4) as pool:
        scans = list(pool.map(lambda job: scan_job_input(job, store, model_info), jobs * 2))
    for i, scan in enumerate(scans):
        assert scan.ok, scan.reason()
        assert [(p.custom_id, p.tokens) for p in scan.prompts] == alone[i % len(jobs)]
        scan.close()
