"""Adaptation from telemetry alone: two identical colocated pools; one is made 4x slower at run
time (fault injection through its throttle file — nobody tells the router). Two links of the
chain are checked live: the telemetry rows the profile builder publishes show the slowed pool's
steps taking at least twice as long, and the router's share of new work sent to it drops within
a bounded time and does not swing back.

The shares are measured from what the control plane actually dispatched (the prefill topics),
while a steady stream of new work comes in; what is still queued when the stream ends is
cancelled (the test measures decisions, not how long a slowed fleet takes to drain). The policy
alone, without the live chain, is checked deterministically in the simulator
(``tests/sim/test_scenarios.py::test_stale_profile_phaseroute_moves_work_away_static_spec_does_not``)."""

from __future__ import annotations

import json
import math
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from phaseroute.cli.pools_cmd import read_since
from phaseroute.infra import topics
from phaseroute.streams.policy import ProfileRow
from phaseroute.streams.profiles.convert import from_avro

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


def _telemetry_speed(bootstrap: str, since: float) -> dict[tuple[str, str], ProfileRow]:
    """(pool, phase) -> the newest TELEMETRY row published since ``since``: what the router's
    table holds for the pool."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"adapt-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        rows = read_since(consumer, topics.PROFILES, since, "profile_row", 15)
    finally:
        consumer.close()
    newest: dict[tuple[str, str], dict] = {}
    for row in rows:
        key = (row["pool"], row["phase"])
        if row["source"] == "TELEMETRY" and row["phase"] in ("PREFILL", "DECODE") and row["pool"] in (FAST, SLOW) \
                and row["updated_at"] >= newest.get(key, row)["updated_at"]:
            newest[key] = row
    out: dict[tuple[str, str], ProfileRow] = {}
    for key, row in newest.items():
        parsed = from_avro(row)
        assert isinstance(parsed, ProfileRow), row
        out[key] = parsed
    return out


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


def test_router_moves_work_off_a_pool_slowed_at_run_time(bootstrap: str, tmp_path: Path) -> None:
    profile_pools({FAST: "fp32", SLOW: "fp32"})
    throttle = tmp_path / "slow-factor"
    throttle.write_text("1")
    stack = LiveStack(bootstrap, tmp_path / "logs")
    try:
        stack.services()
        stack.worker(FAST, "both", "fp32", "--max-decode-batch", "4")
        stack.worker(SLOW, "both", "fp32", "--max-decode-batch", "4", "--throttle-file", str(throttle))
        stack.wait_ready([FAST, SLOW])
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
        ended = time.time()
        for job_id in jobs:  # the rest of the stream is not measured: cancel it, and wait until every line is written
            subprocess.run([*CLI, "cancel", job_id, "--tenant", "acme"], capture_output=True, text=True, timeout=60)
        for job_id in jobs:
            assert stack.wait_job(job_id, 300)["state"] in ("COMPLETED", "CANCELLED")
    finally:
        stack.stop_all()
    speeds = _telemetry_speed(bootstrap, slowed_at + 60)
    times = _dispatch_times(bootstrap, started - 1)
    before = _shares(times, started, slowed_at)
    after = _shares(times, slowed_at, ended)
    print(f"\n[figures] share of new work to the slowed pool per {WINDOW_S:.0f} s window: before {before}, after {after}")
    curves = {f"{pool}/{phase}": [(c.batch_size, round(c.tokens_per_s, 1)) for c in row.curve]
              for (pool, phase), row in speeds.items()}
    print(f"[figures] telemetry batch curves (batch, tokens/s) from 60 s after the slowdown: {curves}")
    share_before = sum(b * n for _, b, n in before) / sum(n for *_, n in before)
    late = [(s, n) for t, s, n in after if t >= 60 and n >= 5]  # bounded reaction time: 60 s after the slowdown
    # the telemetry chain saw the slowdown: for each phase, at some batch size either pool's curve
    # has a point, the slowed pool's tokens/s (as the router reads a curve: between and beyond its
    # points) is at most half the other's (the throttle makes it a quarter; both pools share two
    # cores with the rest of the stack). Not at every batch size: a curve point the slowed pool no
    # longer reaches keeps its last (pre-slowdown) value until its fresh points contradict it,
    # since the decay weighs samples against the others of their own bucket (seen: decode at batch
    # 2, 17.9 vs 16.8 tok/s). The router weighs pools at full batch: a contradicted stale point is
    # dropped (``profile_builder._drop_contradicted``); kept, it held a 4x slower pool at 290 prefill
    # tokens/s at batch 4 against the other's 252, and its share of new work at 0.41 (a CI failure)
    for phase in ("PREFILL", "DECODE"):
        slow, fast = speeds.get((SLOW, phase)), speeds.get((FAST, phase))
        assert slow is not None and fast is not None, f"{phase}: no telemetry row of both pools after the slowdown: {curves}"
        sizes = sorted({c.batch_size for c in slow.curve} | {c.batch_size for c in fast.curve})
        ratios = {b: round(slow.tokens_per_s(b) / fast.tokens_per_s(b), 3) for b in sizes if fast.tokens_per_s(b) > 0}
        assert min(ratios.values()) <= 0.5, f"{phase}: the slowdown is in no curve point (slowed/other per batch: {ratios}; {curves})"
    assert share_before >= 0.3, f"both pools should share the work before the slowdown ({share_before:.2f})"
    assert len(late) >= 4, f"too few windows after the reaction time: {after}"
    mean = lambda ws: sum(s * n for s, n in ws) / sum(n for _, n in ws)
    # a 4x slower pool has 1/5 of the capacity: its share must fall clearly below an even split.
    # Measured: 0.13-0.27 per window in CI, a late mean of ~0.34 on a machine loaded by other work;
    # the bound leaves room for that and still fails a router that does not react (an even split
    # over ~60 late dispatches falls under 0.4 about 6% of the time)
    assert mean(late) <= 0.4 and mean(late) <= share_before - 0.05, f"slowed pool still gets {mean(late):.2f} ({after})"
    # no oscillation: the later half of the windows does not swing back toward the old share. The
    # halves hold ~50-80 dispatches each, so their shares differ by binomial noise alone with a
    # standard error of ~0.075: a fixed margin of 0.1 (1.3 standard errors) failed a router that
    # held its share (CI: 0.18 then 0.28 over 50 and 82 dispatches, each window 0.17-0.35). The
    # margin is two standard errors of the two halves' counts (a 2% false alarm), at least 0.1;
    # a swing back to the share before the slowdown (~0.35) still fails it.
    half = len(late) // 2
    early, later = mean(late[:half]), mean(late[half:])
    n_early, n_later = sum(n for _, n in late[:half]), sum(n for _, n in late[half:])
    pooled = mean(late)
    margin = max(0.1, 2 * math.sqrt(pooled * (1 - pooled) * (1 / n_early + 1 / n_later)))
    assert later <= early + margin, f"share swung back up: {early:.2f} then {later:.2f} (margin {margin:.2f}): {after}"
