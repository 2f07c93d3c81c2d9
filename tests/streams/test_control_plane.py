"""The control plane's decisions between events: admission, idempotent resubmission, fairness
under a flood, retries away from a failing pool, cancellation.

These drive ``ControlPlane`` directly (the Faust app only feeds it events and sends what it
returns). The pools are a fleet we do not have here, described by heartbeats and profile rows
(fakes for hardware, as the standards allow); the tokenizer is SmolLM2's real one.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from phaseroute.config import settings
from phaseroute.schemas.ids import request_id
from phaseroute.streams.control import ControlConfig, ControlPlane
from phaseroute.streams.model_catalog import load_model_info
from phaseroute.streams.policy import CurvePoint, FairConfig, Phase, ProfileRow, ProfileSource
from phaseroute.streams.profiles.convert import row_to_avro
from phaseroute.streams.views import PoolView, ProfileView

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def model_info():
    return load_model_info(MODEL, settings().model_cache)


def heartbeat(pool: str, phase: str, now: float, variant: str = "fp32", max_batch: int = 8) -> dict[str, Any]:
    return {"pool": pool, "worker_id": f"{pool}-0", "phase": phase, "variant": variant, "device": "cpu",
            "models": [MODEL], "queue_depth": 0, "consumer_lag": 0, "batch_in_flight": 0, "max_batch": max_batch,
            "memory_bytes": 10**9, "kv_free_bytes": 4 * 10**9, "host": "test", "pid": 1, "status": "UP",
            "started_at": int((now - 60) * 1000), "interval_s": 2.0, "at": int(now * 1000)}


def profile(pool: str, phase: Phase, tokens_per_s: float, now: float, error_rate: float = 0.0,
            samples: int = 500, variant: str = "fp32") -> dict[str, Any]:
    row = ProfileRow(MODEL, phase, pool, variant, (CurvePoint(1, tokens_per_s / 4), CurvePoint(8, tokens_per_s)),
                     0.05, 0.08, 0.1, 46080.0, 46080.0, error_rate, 1.0, samples, now, ProfileSource.TELEMETRY)
    return row_to_avro(row, 900.0)


def plane(model_info, pools: dict[str, str], now: float, fair: FairConfig | None = None,
          speed: dict[str, float] | None = None) -> ControlPlane:
    pool_view, profile_view = PoolView(), ProfileView()
    for name, phase in pools.items():
        pool_view.on_record(heartbeat(name, phase, now))
        phases = [Phase.PREFILL, Phase.DECODE] if phase == "BOTH" else [Phase(phase.lower())]
        for ph in phases:
            base = 500.0 if ph is Phase.PREFILL else 150.0
            profile_view.on_record(profile(name, ph, base * (speed or {}).get(name, 1.0), now))
    config = ControlConfig(fair=fair or FairConfig(), results_dir="/tmp/results")
    return ControlPlane({}, {}, profile_view, pool_view, {MODEL: model_info}, config, seed=1)


def job(job_id: str, tenant: str, n: int, deadline_s: float, now: float, max_tokens: int = 16) -> dict[str, Any]:
    return {"job_id": job_id, "tenant": tenant, "priority": 1, "submitted_at": int(now * 1000),
            "deadline": int((now + deadline_s) * 1000), "model": MODEL, "quality_tier": "EXACT", "quality_tolerance": None,
            "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens},
            "requests": [{"custom_id": f"{tenant}-{i}", "prompt": None, "max_tokens": max_tokens,
                          "messages": [{"role": "user", "content": f"Question number {i}: what is {i} plus {i}?"}]}
                         for i in range(n)], "input_file": None, "output_file": None, "metadata": {}}


def admit_all(cp: ControlPlane, record: dict[str, Any], now: float) -> list:
    sends = list(cp.submit(record, now))  # request sends come lazily, streamed from the intake spool
    for s in sends:
        if s.topic == "requests.pending":
            cp.pending(s.record, now)
    return sends


def finish(cp: ControlPlane, work: dict[str, Any], now: float, tokens: int = 16, receipt: bool = True) -> list:
    """A result for the work; with ``receipt``, also the result sink's receipt for the lines it wrote."""
    sends = cp.result({"request_id": work["request_id"], "job_id": work["job_id"], "tenant": work["tenant"],
                       "status": "OK", "prompt_tokens": work["prompt_tokens"], "completion_tokens": tokens}, now)
    if receipt:
        job_entry = cp.jobs[work["job_id"]]
        sends += written(cp, work["job_id"], job_entry["done"] + job_entry["failed"], now)
    return sends


def written(cp: ControlPlane, job_id: str, lines: int, now: float) -> list:
    return cp.output_written({"job_id": job_id, "lines": lines, "path": f"/tmp/results/{job_id}.jsonl",
                              "writer": "result-sink.test", "at": int(now * 1000)}, now)


def states(sends: list) -> list[str]:
    return [s.record["state"] for s in sends if s.topic == "jobs.events"]


def test_infeasible_deadline_is_rejected_naming_a_feasible_one(model_info) -> None:
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    sends = cp.submit(job("j-rush", "acme", 400, deadline_s=2, now=now, max_tokens=64), now)
    event = next(s.record for s in sends if s.topic == "jobs.events")
    assert event["state"] == "REJECTED"
    assert "earliest feasible deadline" in event["reason"] and "resubmit with a deadline at or after" in event["reason"]
    assert event["earliest_feasible_deadline"] > event["deadline"]
    # the deadline it names is feasible: the same job with it is admitted
    feasible_s = event["earliest_feasible_deadline"] / 1000 - now + 1
    again = cp.submit(job("j-rush-2", "acme", 400, deadline_s=feasible_s, now=now, max_tokens=64), now)
    assert next(s.record for s in again if s.topic == "jobs.events")["state"] == "ADMITTED"


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda j: j.update(model="gpt-9"), "gpt-9"),
    (lambda j: j.update(requests=[]), "no requests"),
    (lambda j: j.update(deadline=j["submitted_at"] - 60_000), "deadline"),
    (lambda j: j["requests"][0].update(messages=[{"role": "user", "content": "word " * 9000}]), "8192"),
    (lambda j: j.update(input_file="/nonexistent/batch.jsonl", requests=[]), "/nonexistent/batch.jsonl"),
    # the holes: a file outside the tenant's blob-store prefix, and a job id that escapes a path
    (lambda j: j.update(input_file="/etc/passwd", requests=[]), "'/etc/passwd' is not a blob-store key"),
    (lambda j: j.update(job_id="../../etc/evil"), "job id '../../etc/evil' must be"),
])
def test_invalid_jobs_are_rejected_with_a_reason_a_user_can_act_on(model_info, mutate, needle) -> None:
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    record = job("j-bad", "acme", 2, 600, now)
    mutate(record)
    event = next(s.record for s in cp.submit(record, now) if s.topic == "jobs.events")
    assert event["state"] == "REJECTED"
    assert needle in event["reason"]


def test_resubmitted_job_id_is_not_run_twice(model_info) -> None:
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    first = admit_all(cp, job("j-1", "acme", 3, 600, now), now)
    second = list(cp.submit(job("j-1", "acme", 3, 600, now), now + 1))
    assert sum(s.topic == "requests.pending" for s in first) == 3
    assert not any(s.topic == "requests.pending" for s in second)
    assert next(s.record for s in second if s.topic == "jobs.events")["reason"].startswith("job id already submitted")
    dispatched = [s for s in cp.tick(now + 1) if s.topic.startswith("prefill.")]
    assert len({s.record["request_id"] for s in dispatched}) == 3


def test_flooding_tenant_cannot_starve_a_small_one(model_info) -> None:
    """A submits 20x B's tokens at once; while both are backlogged B's served cost stays within
    the VTC bound of its weighted share (weights 1:1)."""
    now = time.time()
    fair = FairConfig(max_unit_requests=4)
    cp = plane(model_info, {"colo": "BOTH"}, now, fair=fair)
    admit_all(cp, job("flood", "tenant-a", 200, 7200, now), now)
    admit_all(cp, job("small", "tenant-b", 10, 7200, now), now)
    served = {"tenant-a": 0.0, "tenant-b": 0.0}
    running: list[dict[str, Any]] = []
    t = now
    gaps = []
    while any(r["status"] == "pending" for r in cp.requests.values() if r["tenant"] == "tenant-b"):
        t += 0.5
        running += [s.record for s in cp.tick(t) if s.topic.startswith("prefill.")]
        for work in running[:4]:  # the fleet finishes 4 requests per step
            finish(cp, work, t)
            served[work["tenant"]] += work["prompt_tokens"] + 2 * 16
        running = running[4:]
        gaps.append(served["tenant-a"] - served["tenant-b"])
        assert t - now < 600, "tenant-b never got its requests served"
    bound = fair.max_unit_cost + 2 * max(r["prompt_tokens"] + 2 * r["max_tokens"] for r in cp.requests.values())
    assert max(abs(g) for g in gaps) <= bound, f"gap {max(gaps)} exceeds the VTC bound {bound}"
    pending_a = sum(r["status"] == "pending" for r in cp.requests.values() if r["tenant"] == "tenant-a")
    assert pending_a > 150, "B was served only after A drained: that is not fairness"


def test_a_pool_failing_every_attempt_gets_no_further_work(model_info) -> None:
    now = time.time()
    cp = plane(model_info, {"bad": "BOTH", "good": "BOTH"}, now)
    admit_all(cp, job("j-retry", "acme", 12, 3600, now), now)
    t, done = now, set()
    sent_to_bad_after_failures = 0
    for _ in range(200):
        t += 1.0
        measured = cp._failures.get("bad", 0) >= 1  # the profile already carries the pool's failures
        for s in cp.tick(t):
            if not s.topic.startswith("prefill."):
                continue
            work = s.record
            if s.topic == "prefill.bad":
                sent_to_bad_after_failures += measured
                cp.attempt_failed({"attempt_id": work["attempt_id"], "request_id": work["request_id"], "job_id": work["job_id"],
                                   "tenant": work["tenant"], "attempt": work["attempt"], "phase": "PREFILL", "pool": "bad",
                                   "worker_id": "bad-0", "error_class": "RuntimeError", "error": "device lost",
                                   "retryable": True, "at": int(t * 1000)}, t)
                # the pool's telemetry now measures its failures: the profile builder would publish this
                cp.profiles.on_record(profile("bad", Phase.PREFILL, 500.0, t, error_rate=1.0))
                cp.profiles.on_record(profile("bad", Phase.DECODE, 150.0, t, error_rate=1.0))
            else:
                finish(cp, work, t)
                done.add(work["request_id"])
        if len(done) == 12:
            break
    assert len(done) == 12, "the job must complete on the healthy pool"
    assert cp.jobs["j-retry"]["state"] == "COMPLETED"
    assert sent_to_bad_after_failures == 0
    assert cp.reports.retries >= 1


def test_cancel_drops_queued_requests(model_info) -> None:
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    admit_all(cp, job("j-c", "acme", 50, 3600, now), now)
    first = [s for s in cp.tick(now + 0.5) if s.topic.startswith("prefill.")]
    sends = cp.cancel({"job_id": "j-c", "tenant": "acme", "command": "CANCEL", "at": 0, "reason": "changed my mind"}, now + 1)
    assert next(s.record for s in sends if s.topic == "jobs.events")["state"] == "CANCELLED"
    assert not [s for s in cp.tick(now + 2) if s.topic.startswith("prefill.")]
    assert len(first) < 50


def test_request_ids_are_derived_from_job_and_custom_id(model_info) -> None:
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    sends = admit_all(cp, job("j-ids", "acme", 2, 600, now), now)
    ids = [s.record["request_id"] for s in sends if s.topic == "requests.pending"]
    assert ids == [request_id("j-ids", "acme-0"), request_id("j-ids", "acme-1")]


def test_straggler_gets_a_speculative_copy_and_the_first_result_wins(model_info) -> None:
    now = time.time()
    cp = plane(model_info, {"p1": "BOTH", "p2": "BOTH"}, now)
    admit_all(cp, job("j-s", "acme", 1, 3600, now), now)
    first = [s for s in cp.tick(now + 0.1) if s.topic.startswith("prefill.")]
    assert len(first) == 1
    t = now + 600  # far beyond any measured latency of the profile
    for name in ("p1", "p2"):  # both pools still alive
        cp.pools.on_record(heartbeat(name, "BOTH", t))
    copies = [s for s in cp.tick(t) if s.topic.startswith("prefill.")]
    assert len(copies) == 1 and copies[0].topic != first[0].topic, "the copy goes to another pool"
    assert copies[0].record["attempt_id"] != first[0].record["attempt_id"]
    assert cp.reports.speculative == 1
    finish(cp, copies[0].record, t + 1)
    finish(cp, first[0].record, t + 2)  # the loser arrives later: ignored by request id
    job_entry = cp.jobs["j-s"]
    assert (job_entry["state"], job_entry["done"]) == ("COMPLETED", 1)


def test_job_completes_only_when_the_sink_has_written_every_line(model_info) -> None:
    """Every result counted is not enough: COMPLETED waits for the sink's receipt that the
    output file holds a line per request, so a reader of the final event finds the file whole."""
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    admit_all(cp, job("j-w", "acme", 3, 3600, now), now)
    works = [s.record for s in cp.tick(now + 0.1) if s.topic.startswith("prefill.")]
    assert len(works) == 3
    sends = []
    for i, work in enumerate(works):
        sends += finish(cp, work, now + 1 + i, receipt=False)
    assert "COMPLETED" not in states(sends) and cp.jobs["j-w"]["state"] == "RUNNING"
    assert written(cp, "j-w", 2, now + 5) == [] and cp.jobs["j-w"]["state"] == "RUNNING"
    assert states(written(cp, "j-w", 3, now + 6)) == ["COMPLETED"]
    assert cp.jobs["j-w"]["finished_at"] == now + 6
    assert written(cp, "j-w", 3, now + 7) == [], "a replayed receipt changes nothing"


def test_a_receipt_ahead_of_the_last_result_completes_the_job_on_that_result(model_info) -> None:
    """Receipts and results come on different topics: either may be the last to arrive, and a
    replayed receipt with an older count never lowers what is known to be written."""
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    admit_all(cp, job("j-r", "acme", 2, 3600, now), now)
    works = [s.record for s in cp.tick(now + 0.1) if s.topic.startswith("prefill.")]
    finish(cp, works[0], now + 1, receipt=False)
    written(cp, "j-r", 2, now + 2)
    written(cp, "j-r", 1, now + 3)  # an older receipt, replayed
    assert cp.jobs["j-r"]["lines_written"] == 2 and cp.jobs["j-r"]["state"] == "RUNNING"
    assert "COMPLETED" in states(finish(cp, works[1], now + 4, receipt=False))


def test_in_flight_work_of_a_pool_whose_heartbeats_stop_is_redispatched(model_info) -> None:
    now = time.time()
    cp = plane(model_info, {"p1": "BOTH", "p2": "BOTH"}, now)
    admit_all(cp, job("j-loss", "acme", 6, 3600, now), now)
    sent = [s for s in cp.tick(now + 0.1) if s.topic.startswith("prefill.")]
    on_p1 = {s.record["request_id"] for s in sent if s.topic == "prefill.p1"}
    assert on_p1, "the router should use both pools"
    t = now + 30  # p1 went silent; p2 keeps beating
    cp.pools.on_record(heartbeat("p2", "BOTH", t))
    redo = [s for s in cp.tick(t) + cp.tick(t + 0.5) if s.topic.startswith("prefill.")]
    assert {s.record["request_id"] for s in redo} >= on_p1
    assert all(s.topic == "prefill.p2" for s in redo), "nothing goes to the dead pool"
    assert cp.reports.redispatched == len(on_p1)


def test_a_request_stranded_by_a_lost_pool_fails_with_the_reason_once_its_deadline_passed(model_info) -> None:
    """p1 is the only pool whose workers can hold these requests' KV; it vanishes before they are
    placed. They wait (p1 may come back) until give_up_unplaced ends the wait after the deadline:
    each gets a failed result naming why, and the job reaches FAILED instead of hanging."""
    now = time.time()
    cp = plane(model_info, {"p1": "BOTH", "p2": "BOTH"}, now)
    cp.pools.on_record(dict(heartbeat("p1", "BOTH", now), kv_capacity_bytes=4 * 10**9))
    cp.pools.on_record(dict(heartbeat("p2", "BOTH", now), kv_free_bytes=10**5, kv_capacity_bytes=10**5))  # 2 tokens
    admit_all(cp, job("j-strand", "acme", 3, 600, now), now)
    assert cp.jobs["j-strand"]["state"] == "ADMITTED"

    def tick(t: float) -> list:
        cp.pools.on_record(dict(heartbeat("p2", "BOTH", t), kv_free_bytes=10**5, kv_capacity_bytes=10**5))
        return cp.tick(t)

    assert tick(now + 30) == [], "p1 is silent, p2 too small: nothing is placed, nothing fails yet"
    assert tick(now + 599) == [] and all(r["status"] == "pending" for r in cp.requests.values())
    failed = [s.record for s in tick(now + 30 + cp.config.retry.unplaced_give_up_s) if s.topic == "results"]
    assert len(failed) == 3 and {r["status"] for r in failed} == {"FAILED"}
    assert failed[0]["error"].startswith("no pool could place it for 1800 s and its deadline has passed: ")
    assert "p1/decode: alive: pool is not alive" in failed[0]["error"], failed[0]["error"]
    assert "p2/decode: memory: needs " in failed[0]["error"], failed[0]["error"]
    for record in failed:
        cp.result(record, now + 1900)
    assert states(written(cp, "j-strand", 3, now + 1901)) == ["FAILED"]


def test_a_restarted_control_plane_keeps_the_tenants_counters_and_running_slots(model_info) -> None:
    """The fairness table holds each tenant's VTC counter: a control plane rebuilt from the same
    tables (as Faust rebuilds them from their changelogs) continues the tenants' counters and
    counts the requests still running against their in-flight caps."""
    now = time.time()
    first = plane(model_info, {"colo": "BOTH"}, now)
    admit_all(first, job("j-flood", "flood", 30, 3600, now), now)
    sent = [s for s in first.tick(now + 0.1) if s.topic.startswith("prefill.")]
    assert sent and set(first.fairness) == {"flood"}
    before = first.fair.state()
    assert first.fairness["flood"] == {"counter": before["flood"][0], "served_cost": before["flood"][1]}

    again = ControlPlane(first.jobs, first.requests, first.profiles, first.pools, first.models, first.config,
                         fairness=first.fairness)
    again.restore(now + 1)
    assert again.fair.state() == before
    (report,) = again.fair.report()
    assert report.in_flight == len(sent) and report.queued_requests == 30 - len(sent)


def test_pool_view_reports_the_roomiest_worker_and_the_pool_sum():
    """Three workers of one pool: the router sees the sum of free KV and the most any one worker
    has (the KV of a request lives on one worker); a dead worker counts in neither."""
    now = time.time()
    view = PoolView(dead_after_s=8.0)
    for i, (free, capacity, age) in enumerate([(1 * 10**9, 5 * 10**9, 0.0), (3 * 10**9, 4 * 10**9, 0.0),
                                                (9 * 10**9, 9 * 10**9, 60.0)]):
        beat = heartbeat("gpu", "BOTH", now - age)
        beat.update(worker_id=f"gpu-{i}", kv_free_bytes=free, kv_capacity_bytes=capacity)
        view.on_record(beat)
    state = view.states(now, {}, {})["gpu"]
    assert (state.workers, state.free_kv_bytes, state.worker_free_kv_bytes, state.worker_kv_capacity_bytes) == (
        2, 4 * 10**9, 3 * 10**9, 5 * 10**9)
    # a worker of an older release says nothing of its capacity: no pool-wide limit can be claimed
    old = heartbeat("gpu", "BOTH", now)
    old.update(worker_id="gpu-3", kv_free_bytes=10**9)
    old.pop("kv_capacity_bytes", None)
    view.on_record(old)
    assert view.states(now, {}, {})["gpu"].worker_kv_capacity_bytes is None
