"""Adaptation from telemetry alone: two identical colocated pools; one is made 4x slower at run
time (fault injection through its throttle file — nobody tells the router). The router's share
of new work sent to it must drop within a bounded time and not swing back and forth.

The shares are measured from what the control plane actually dispatched (the prefill topics)."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from phaseroute.cli.pools_cmd import read_since

from .stack_fixture import CLI, LiveStack, profile_pools

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.slow]
FAST, SLOW = "adapt-a", "adapt-b"
WINDOW_S = 20.0


def _submit(tmp_path: Path, job_id: str, n: int) -> None:
    path = tmp_path / f"{job_id}.jsonl"
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"custom_id": f"q{i}", "body": {"max_tokens": 12, "messages": [
                {"role": "user", "content": f"Name a colour and a number ({i})."}]}}) + "\n")
    proc = subprocess.run([*CLI, "submit", str(path), "--tenant", "acme", "--deadline", "1h", "--job-id", job_id],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def _dispatch_times(bootstrap: str, since: float) -> dict[str, list[float]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"adapt-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        return {pool: sorted(r["dispatched_at"] / 1000 for r in read_since(consumer, f"prefill.{pool}", since, "prefill_work", 15))
                for pool in (FAST, SLOW)}
    finally:
        consumer.close()


def _shares(times: dict[str, list[float]], start: float, end: float) -> list[tuple[float, float, int]]:
    """(window start, share to SLOW, dispatches) per window."""
    out, t = [], start
    while t < end:
        a = sum(t <= x < t + WINDOW_S for x in times[FAST])
        b = sum(t <= x < t + WINDOW_S for x in times[SLOW])
        if a + b:
            out.append((round(t - start), b / (a + b), a + b))
        t += WINDOW_S
    return out


@pytest.mark.xfail(strict=False, reason=(
    "borderline, open (issue-11 note of 2026-12-02): after a 4x slowdown the slowed pool's share falls from 0.45 to "
    "0.29-0.36 per window within 3 minutes (run under load), around the 0.33 bound; the reaction is paced by the "
    "share-target step (max_share_step) and the confidence blend of the cold-start profile with telemetry"))
def test_router_moves_work_off_a_pool_slowed_at_run_time(bootstrap: str, tmp_path: Path) -> None:
    profile_pools({FAST: "fp32", SLOW: "fp32"})
    throttle = tmp_path / "slow-factor"
    throttle.write_text("1")
    stack = LiveStack(bootstrap, tmp_path / "logs")
    try:
        stack.services()
        stack.worker(FAST, "both", "fp32", "--max-decode-batch", "4")
        stack.worker(SLOW, "both", "fp32", "--max-decode-batch", "4", "--throttle-file", str(throttle))
        started = time.time()
        _submit(tmp_path, f"warm-{uuid.uuid4().hex[:6]}", 24)  # both pools measured at full speed
        time.sleep(50)
        throttle.write_text("4")
        slowed_at = time.time()
        jobs = []
        while time.time() < slowed_at + 60 + 4 * WINDOW_S:  # a steady stream of new work, long enough
            jobs.append(f"after-{uuid.uuid4().hex[:6]}")  # for 4 windows after the reaction time
            _submit(tmp_path, jobs[-1], 24)
            time.sleep(15)
        for job_id in jobs:
            stack.wait_job(job_id, 400)
        ended = time.time()
    finally:
        stack.stop_all()
    times = _dispatch_times(bootstrap, started - 1)
    before = _shares(times, started, slowed_at)
    after = _shares(times, slowed_at, ended)
    print(f"\n[figures] share of new work to the slowed pool per {WINDOW_S:.0f} s window: before {before}, after {after}")
    share_before = sum(b * n for _, b, n in before) / sum(n for *_, n in before)
    late = [(s, n) for t, s, n in after if t >= 60 and n >= 5]  # bounded reaction time: 60 s after the slowdown
    assert share_before >= 0.3, f"both pools should share the work before the slowdown ({share_before:.2f})"
    assert len(late) >= 4, f"too few windows after the reaction time: {after}"
    mean = lambda ws: sum(s * n for s, n in ws) / sum(n for _, n in ws)
    # a 4x slower pool has 1/5 of the capacity: its share must fall well below an even split
    assert mean(late) <= 0.33 and mean(late) <= share_before - 0.1, f"slowed pool still gets {mean(late):.2f} ({after})"
    # no oscillation: the later half does not swing back toward the old share (binomial noise of
    # ~13 dispatches per window is ~0.12, so windows are compared in halves, not one by one)
    half = len(late) // 2
    assert mean(late[half:]) <= mean(late[:half]) + 0.1, f"share swung back up: {after}"
