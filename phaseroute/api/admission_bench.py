"""``phaseroute bench admission``: how long a 50,000-line batch takes to be admitted through the
Batch API, what it costs in memory, and what it does to another tenant's small batch.

On the running broker (``phaseroute up``) it starts its own stack as separate processes (Batch
API, control plane, result sink, telemetry service, one colocated worker; the pool is profiled
first), makes two tenants, and with the official ``openai`` SDK:
1. uploads an N-line input file (default 50,000) and creates a batch with it;
2. one second later creates a one-request batch for the other tenant;
3. times create -> ``in_progress`` (admitted) for both and -> ``completed`` for the small one,
   while sampling every process's RSS (peak per process);
4. cancels the big batch and stops everything it started.
The figures are printed (``--json`` for one JSON document). Nothing here is a pass/fail
threshold: it measures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Self

import psutil

from phaseroute.config import Settings

POOL = "bench-admit"
CLI = [sys.executable, "-m", "phaseroute.cli.main"]
FINAL = ("completed", "failed", "expired", "cancelled")


def write_input(path: Path, lines: int, prefix: str = "r") -> int:
    with path.open("w") as fh:
        for i in range(lines):
            fh.write(json.dumps({"custom_id": f"{prefix}{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
                "model": "smollm2-135m", "max_tokens": 1,
                "messages": [{"role": "user", "content": f"Request {i}: name one fact about the number {i}."}]}}) + "\n")
    return path.stat().st_size


class _Peaks:
    """Peak RSS of each named process, sampled in a thread."""

    def __init__(self, procs: dict[str, subprocess.Popen[bytes]]) -> None:
        self.procs, self.peak = procs, {name: 0 for name in procs}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, proc in list(self.procs.items()):
                try:
                    self.peak[name] = max(self.peak.get(name, 0), psutil.Process(proc.pid).memory_info().rss)
                except psutil.Error:
                    pass
            time.sleep(0.25)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)


def start_process(procs: dict[str, subprocess.Popen[bytes]], logs: Path, name: str, *args: str) -> None:
    log = open(logs / f"{name}.log", "ab")
    procs[name] = subprocess.Popen([*CLI, *args], stdout=log, stderr=subprocess.STDOUT)


def stop_processes(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.terminate()
    for proc in procs.values():
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _wait_status(client: Any, batch_id: str, until: tuple[str, ...], timeout_s: float) -> tuple[Any, float]:
    started = time.time()
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in until:
            return batch, time.time()
        if time.time() - started > timeout_s:
            raise TimeoutError(f"batch {batch_id} still {batch.status} after {timeout_s:.0f} s")
        time.sleep(0.25)


def _tenant(name: str) -> str:
    proc = subprocess.run([*CLI, "tenants", "add", name], check=False, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip())
    return proc.stdout.strip()


def run_bench(settings: Settings, lines: int = 50_000, profile: bool = True, timeout_s: float = 480.0) -> dict[str, Any]:
    from openai import OpenAI

    from phaseroute.infra import provision, topics

    logs = settings.run_dir / "bench-admission"
    logs.mkdir(parents=True, exist_ok=True)
    big_file = logs / "big.jsonl"
    size = write_input(big_file, lines)
    if profile:
        subprocess.run([*CLI, "profile", "--pool", POOL, "--variant", "fp32", "--quick", "--threads", "1"], check=True,
                       capture_output=True, timeout=900)
    provision.provision(settings.bootstrap_servers, list(topics.pool_topics(POOL)))
    procs: dict[str, subprocess.Popen[bytes]] = {}
    cleanup: list[tuple[Any, str]] = []  # (client, batch id) to cancel whatever happens
    try:
        for name, args in (("telemetry", ("sink", "telemetry")), ("results", ("sink", "results")), ("control", ("control",)),
                           ("worker", ("worker", "--pool", POOL, "--phase", "both", "--threads", "1")),
                           ("api", ("api", "--port", str(settings.api_port)))):
            start_process(procs, logs, name, *args)
        suffix = os.urandom(3).hex()
        big_key, small_key = _tenant(f"bench-big-{suffix}"), _tenant(f"bench-small-{suffix}")
        base = settings.api_base_url
        _wait_api(base, big_key, procs, logs)
        big, small = OpenAI(base_url=base, api_key=big_key), OpenAI(base_url=base, api_key=small_key)
        with _Peaks(procs) as peaks:
            t0 = time.time()
            with big_file.open("rb") as fh:
                uploaded = big.files.create(file=fh, purpose="batch")
            t_upload = time.time()
            # the openai SDK types completion_window as OpenAI's only window ("24h"); this API takes others
            big_batch = big.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                           completion_window="30d")  # type: ignore[arg-type]
            t_create = time.time()
            cleanup.append((big, big_batch.id))
            time.sleep(1.0)
            small_file = small.files.create(file=("one.jsonl", _one_line()), purpose="batch")
            # as above: a window other than "24h", which the SDK's Literal type does not allow
            small_batch = small.batches.create(input_file_id=small_file.id, endpoint="/v1/chat/completions",
                                               completion_window="1h")  # type: ignore[arg-type]
            t_small = time.time()
            admitted, t_admitted = _wait_status(big, big_batch.id, ("in_progress", "finalizing", *FINAL), timeout_s)
            _, t_small_in = _wait_status(small, small_batch.id, ("in_progress", "finalizing", *FINAL), timeout_s)
            small_done, t_small_done = _wait_status(small, small_batch.id, FINAL, timeout_s)
            big.batches.cancel(big_batch.id)
            cancelled, t_cancelled = _wait_status(big, big_batch.id, FINAL, timeout_s)
        return {
            "lines": lines, "file_bytes": size, "upload_s": round(t_upload - t0, 2),
            "big_status": admitted.status, "big_requests_total": admitted.request_counts.total,
            "big_create_to_admitted_s": round(t_admitted - t_create, 2),
            "small_create_to_admitted_s": round(t_small_in - t_small, 2), "small_status": small_done.status,
            "small_create_to_completed_s": round(t_small_done - t_small, 2),
            "big_cancel_to_cancelled_s": round(t_cancelled - t_small_done, 2), "big_final": cancelled.status,
            "peak_rss_mb": {name: round(rss / 2**20) for name, rss in peaks.peak.items()},
            "logs": str(logs), "note": "measured on a shared 2-core machine; other processes were running",
        }
    finally:
        for client, batch_id in cleanup:  # never leave 50,000 requests queued in the broker's tables
            try:
                if client.batches.retrieve(batch_id).status not in FINAL:
                    client.batches.cancel(batch_id)
                    _wait_status(client, batch_id, FINAL, 120)
            except Exception as exc:
                print(f"could not cancel {batch_id}: {exc}; cancel it with `phaseroute cancel`", file=sys.stderr)
        stop_processes(procs)


def run_intake_only(settings: Settings, lines: int = 50_000) -> dict[str, Any]:
    """``scan_job_input`` alone on an N-line file in a local blob store, in this process: the
    intake's own time and memory, without the control plane around it."""
    import resource
    import tempfile

    from phaseroute.infra.blobstore import BlobStore, file_key
    from phaseroute.streams.intake import scan_job_input
    from phaseroute.streams.model_catalog import load_model_info

    model = load_model_info("smollm2-135m", settings.model_cache)
    with tempfile.TemporaryDirectory() as tmp:
        store = BlobStore(tmp)
        size = write_input(Path(tmp) / "in.jsonl", lines)
        with (Path(tmp) / "in.jsonl").open("rb") as src, store.writer(file_key("bench", "file-in")) as dst:
            dst.write(src.read())
        job = {"job_id": "bench-intake", "tenant": "bench", "model": "smollm2-135m", "requests": [],
               "input_file": file_key("bench", "file-in"), "sampling": {"max_tokens": 16},
               "metadata": {"endpoint": "/v1/chat/completions"}}
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.perf_counter()
        scan = scan_job_input(job, store, model)
        scanned = time.perf_counter()
        streamed = sum(len(t) for t in scan.texts())
        done = time.perf_counter()
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        scan.close()
    return {"lines": lines, "file_bytes": size, "ok": scan.ok, "prompts": len(scan.prompts),
            "scan_s": round(scanned - started, 2), "stream_back_s": round(done - scanned, 2),
            "rendered_chars": streamed, "peak_rss_mb_before_scan": round(rss_before / 1024),
            "peak_rss_mb_after_scan": round(rss_after / 1024),
            "note": "one process, no control plane; measured on a shared 2-core machine"}


def _one_line() -> bytes:
    return (json.dumps({"custom_id": "only", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "smollm2-135m", "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi."}]}}) + "\n").encode()


def _wait_api(base: str, key: str, procs: dict[str, subprocess.Popen[bytes]], logs: Path, timeout_s: float = 120.0) -> None:
    import httpx

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        dead = [n for n, p in procs.items() if p.poll() is not None]
        if "control" in dead:  # the first start on fresh changelog topics can crash: once more
            procs.pop("control")
            start_process(procs, logs, "control", "control")
        try:
            if httpx.get(base + "/batches", headers={"Authorization": f"Bearer {key}"}, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the Batch API at {base} did not answer within {timeout_s:.0f} s")
