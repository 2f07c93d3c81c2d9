"""The control plane's decisions between records: admission, idempotent resubmission, fairness
under a flood, retries away from a failing pool, stragglers, pool loss, restarts (the records of
a job's end: ``test_job_ends.py``). These drive the live code path without Faust or Kafka
(``plane_fixture.py``)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from phaseroute.schemas.ids import request_id
from phaseroute.streams.policy import FairConfig, Phase
from phaseroute.streams.views import PoolView

from .plane_fixture import MODEL, Plane, admit_all, failed, finish, heartbeat, job, plane, prefill, profile, states, written


def test_infeasible_deadline_is_rejected_naming_a_feasible_one(model_info) -> None:
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    sends = cp.submit(job("j-rush", "acme", 400, deadline_s=2, now=now, max_tokens=64), now)
    event = next(s.record for s in sends if s.topic == "jobs.events")
    assert event["state"] == "REJECTED"
    assert "earliest feasible deadline 20" in event["reason"] and "resubmit with a deadline at or after 20" in event["reason"]
    assert event["earliest_feasible_deadline"] > event["deadline"]
    # the deadline it names is feasible: the same job with it is admitted
    feasible_s = event["earliest_feasible_deadline"] / 1000 - now + 1
    again = cp.submit(job("j-rush-2", "acme", 400, deadline_s=feasible_s, now=now, max_tokens=64), now)
    assert next(s.record for s in again if s.topic == "jobs.events")["state"] == "ADMITTED"


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda j: j.update(model="gpt-9"), "gpt-9"),
    (lambda j: j.update(requests=[]), "the job has no requests"),
    (lambda j: j.update(deadline=j["submitted_at"] - 60_000), "deadline"),
    (lambda j: j["requests"][0].update(messages=[{"role": "user", "content": "word " * 9000}]), "8192"),
    # the holes: a file outside the tenant's blob-store prefix is never opened (and never quoted),
    # and a job id that would escape a path is refused
    (lambda j: j.update(input_file="/etc/passwd", requests=[]), "'/etc/passwd' is not a blob-store key"),
    (lambda j: j.update(input_file="/nonexistent/batch.jsonl", requests=[]), "/nonexistent/batch.jsonl"),
    (lambda j: j.update(job_id="../../etc/evil"), "may hold only letters, digits"),
    (lambda j: j["sampling"].update(temperature=0.7), "decodes greedily only"),
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
    second = cp.submit(job("j-1", "acme", 3, 600, now + 1), now + 1)  # the same id submitted again later
    assert sum(s.topic == "requests.pending" for s in first) == 3
    assert not any(s.topic == "requests.pending" for s in second)
    reason = next(s.record for s in second if s.topic == "jobs.events")["reason"]
    assert reason.startswith("job id already submitted; not run again (it was ADMITTED: estimated completion")
    dispatched = prefill(cp.tick(now + 1))
    assert len({s.record["request_id"] for s in dispatched}) == 3 and len(dispatched) == 3


def test_a_submission_read_again_after_a_restart_queues_what_its_cut_stream_lost(model_info) -> None:
    """kill -9 while a big job's requests stream to requests.pending: the submission is read
    again (its offset was not committed); the requests that never reached the topic are queued
    then, the ones that did are dropped as replays, and each request runs once."""
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    record = job("j-cut", "acme", 6, 600, now)
    pending = [s.record for s in cp.submit(record, now) if s.topic == "requests.pending"]
    for r in pending[:2]:  # the stream was cut after two requests
        cp.record("request", r, now)
    again = [s.record for s in cp.submit(record, now + 1) if s.topic == "requests.pending"]
    assert [r["request_id"] for r in again] == [r["request_id"] for r in pending]
    for r in again:
        cp.record("request", r, now + 1)
    dispatched = [s.record["request_id"] for s in prefill(cp.tick(now + 2))]
    assert sorted(dispatched) == sorted(r["request_id"] for r in pending), "each request dispatched exactly once"


def test_a_rejected_job_id_may_be_submitted_again(model_info) -> None:
    """A rejected id is not burned: the same id with a feasible deadline is judged again and runs;
    the first rejection keeps its own event (another event id) in the job's history."""
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    rejected = cp.submit(job("j-again", "acme", 400, deadline_s=2, now=now, max_tokens=64), now)
    first = next(s.record for s in rejected if s.topic == "jobs.events")
    assert first["state"] == "REJECTED" and "earliest feasible deadline" in first["reason"]
    feasible_s = first["earliest_feasible_deadline"] / 1000 - now + 1
    admitted = admit_all(cp, job("j-again", "acme", 400, deadline_s=feasible_s, now=now, max_tokens=64), now)
    second = next(s.record for s in admitted if s.topic == "jobs.events")
    assert second["state"] == "ADMITTED" and second["event_id"] != first["event_id"]
    assert sum(s.topic == "requests.pending" for s in admitted) == 400
    assert cp.job("j-again")["submissions"] == 2


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
    while any(r.status.name == "QUEUED" for r in cp.requests("tenant-b")):
        t += 0.5
        cp.pools.on_record(heartbeat("colo", "BOTH", t))
        running += [s.record for s in prefill(cp.tick(t))]
        for work in running[:4]:  # the fleet finishes 4 requests per step
            finish(cp, work, t)
            served[work["tenant"]] += work["prompt_tokens"] + 2 * 16
        running = running[4:]
        gaps.append(served["tenant-a"] - served["tenant-b"])
        assert t - now < 600, "tenant-b never got its requests served"
    bound = fair.max_unit_cost + 2 * max(r.work.prompt_tokens + 2 * r.work.max_output_tokens for r in cp.requests())
    assert max(abs(g) for g in gaps) <= bound, f"gap {max(gaps)} exceeds the VTC bound {bound}"
    queued_a = sum(r.status.name == "QUEUED" for r in cp.requests("tenant-a"))
    assert queued_a > 150, "B was served only after A drained: that is not fairness"


def test_a_pool_failing_every_attempt_gets_no_further_work(model_info) -> None:
    now = time.time()
    cp = plane(model_info, {"bad": "BOTH", "good": "BOTH"}, now)
    admit_all(cp, job("j-retry", "acme", 12, 3600, now), now)
    t, done = now, set()
    sent_to_bad_after_failures = 0
    failures_seen = 0
    for _ in range(200):
        t += 1.0
        measured = failures_seen > 0  # the profile already carries the pool's failures
        for name in ("bad", "good"):
            cp.pools.on_record(heartbeat(name, "BOTH", t))
        for s in prefill(cp.tick(t)):
            work = s.record
            if s.topic == "prefill.bad":
                sent_to_bad_after_failures += measured
                cp.record("attempt_failed", failed(work, "bad", t), t)
                # the pool's telemetry now measures its failures: the profile builder would publish this
                cp.profiles.on_record(profile("bad", Phase.PREFILL, 500.0, t, error_rate=1.0))
                cp.profiles.on_record(profile("bad", Phase.DECODE, 150.0, t, error_rate=1.0))
                failures_seen += 1
            else:
                finish(cp, work, t)
                done.add(work["request_id"])
        if len(done) == 12:
            break
    assert len(done) == 12, "the job must complete on the healthy pool"
    assert cp.job("j-retry")["state"] == "COMPLETED"
    assert sent_to_bad_after_failures == 0
    assert cp.core.reports.retries >= 1


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
    first = prefill(cp.tick(now + 0.1))
    assert len(first) == 1
    t = now + 600  # far beyond any measured latency of the profile
    for name in ("p1", "p2"):  # both pools still alive
        cp.pools.on_record(heartbeat(name, "BOTH", t))
    copies = prefill(cp.tick(t))
    assert len(copies) == 1 and copies[0].topic != first[0].topic, "the copy goes to another pool"
    assert copies[0].record["attempt_id"] != first[0].record["attempt_id"]
    assert cp.core.reports.speculative == 1
    finish(cp, copies[0].record, t + 1)
    finish(cp, first[0].record, t + 2)  # the loser arrives later: ignored by request id
    entry = cp.job("j-s")
    assert (entry["state"], entry["done"]) == ("COMPLETED", 1)


def test_a_straggler_whose_copy_cannot_be_placed_does_not_stop_the_tick(model_info) -> None:
    """The crash of the main job: a straggler on the only pool. No other pool can take its copy;
    the tick goes on (it looks again later) and the original finishes the request."""
    now = time.time()
    cp = plane(model_info, {"only": "BOTH"}, now)
    admit_all(cp, job("j-one", "acme", 2, 3600, now), now)
    first = prefill(cp.tick(now + 0.1))
    t = now + 600
    cp.pools.on_record(heartbeat("only", "BOTH", t))
    assert prefill(cp.tick(t)) == [] and cp.core.reports.speculative == 0
    for s in first:
        finish(cp, s.record, t + 1)
    assert cp.job("j-one")["state"] == "COMPLETED"


def test_in_flight_work_of_a_pool_whose_heartbeats_stop_is_redispatched(model_info) -> None:
    now = time.time()
    cp = plane(model_info, {"p1": "BOTH", "p2": "BOTH"}, now)
    admit_all(cp, job("j-loss", "acme", 6, 3600, now), now)
    sent = prefill(cp.tick(now + 0.1))
    on_p1 = {s.record["request_id"] for s in sent if s.topic == "prefill.p1"}
    assert on_p1, "the router should use both pools"
    t = now + 30  # p1 went silent; p2 keeps beating
    cp.pools.on_record(heartbeat("p2", "BOTH", t))
    redo = prefill(cp.tick(t) + cp.tick(t + 0.5))
    assert {s.record["request_id"] for s in redo} >= on_p1
    assert all(s.topic == "prefill.p2" for s in redo), "nothing goes to the dead pool"
    assert cp.core.reports.redispatched == len(on_p1)


def test_a_request_stranded_by_a_lost_pool_fails_with_the_reason_once_its_deadline_passed(model_info) -> None:
    """p1 is the only pool whose workers can hold these requests' KV; it vanishes before they are
    placed. They wait (p1 may come back) until give_up_unplaced ends the wait after the deadline:
    each gets a failed result naming why, and the job reaches FAILED instead of hanging."""
    now = time.time()
    cp = plane(model_info, {"p1": "BOTH", "p2": "BOTH"}, now)
    cp.pools.on_record(dict(heartbeat("p1", "BOTH", now), kv_capacity_bytes=4 * 10**9))
    cp.pools.on_record(dict(heartbeat("p2", "BOTH", now), kv_free_bytes=10**5, kv_capacity_bytes=10**5))  # 2 tokens
    admit_all(cp, job("j-strand", "acme", 3, 600, now), now)
    assert cp.job("j-strand")["state"] == "ADMITTED"

    def tick(t: float) -> list:
        cp.pools.on_record(dict(heartbeat("p2", "BOTH", t), kv_free_bytes=10**5, kv_capacity_bytes=10**5))
        return cp.tick(t)

    assert tick(now + 30) == [], "p1 is silent, p2 too small: nothing is placed, nothing fails yet"
    assert tick(now + 599) == [] and all(not r.status.is_finished for r in cp.requests())
    t = now + 30 + cp.config.retry.unplaced_give_up_s
    failures = [s.record for s in tick(t) + tick(t + 6) if s.topic == "results"]
    assert len(failures) == 3 and {r["status"] for r in failures} == {"FAILED"}
    assert {r["error_code"] for r in failures} == {"no_placement"}
    assert failures[0]["error"].startswith("no pool could place it for 18"), failures[0]["error"]
    assert "its deadline has passed: " in failures[0]["error"]
    assert "p1/decode: alive: pool is not alive" in failures[0]["error"], failures[0]["error"]
    assert "p2/decode: memory: needs " in failures[0]["error"], failures[0]["error"]
    for record in failures:
        cp.record("result", record, now + 1900)
    assert states(written(cp, "j-strand", 3, now + 1901)) == ["RUNNING", "FAILED"]


def test_a_restarted_control_plane_keeps_the_tenants_counters_and_running_slots(model_info) -> None:
    """The tenants table holds each tenant's VTC counter: a control plane rebuilt from the same
    tables (as Faust rebuilds them from their changelogs) continues the tenants' counters and
    counts the requests still running against their in-flight caps."""
    now = time.time()
    first = plane(model_info, {"colo": "BOTH"}, now)
    admit_all(first, job("j-flood", "flood", 30, 3600, now), now)
    sent = prefill(first.tick(now + 0.1))
    first.core.flush()  # the app writes the core's state every second and before each commit
    before = first.core.dispatch.fair.state()
    assert sent and first.store.tenants["flood"] == {"counter": before["flood"][0], "served_cost": before["flood"][1]}

    again = Plane(model_info, now, store=first.store, prompts=first.shell.prompts, pools=first.pools,
                  profiles=first.profiles)
    resent = prefill(again.shell.restore(now + 1))
    # dispatched just before the stop: their sends may be lost, so the same attempts go again
    assert sorted(s.record["attempt_id"] for s in resent) == sorted(s.record["attempt_id"] for s in sent)
    assert again.core.dispatch.fair.state() == before
    (report,) = again.core.dispatch.fair.report()
    assert report.in_flight == len(sent) and report.queued_requests == 30 - len(sent)
    # the restarted plane finishes the job: the running requests' results count, the rest is dispatched
    for s in sent:
        finish(again, s.record, now + 2, receipt=False)
    rest = prefill(again.tick(now + 3))
    assert {s.record["request_id"] for s in rest}.isdisjoint({s.record["request_id"] for s in sent})


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
    assert state.kv_format == f"{MODEL}|float32|30x3x64|v1"
    # a worker of an older release says nothing of its capacity or format: no pool-wide claim is made
    old = heartbeat("gpu", "BOTH", now)
    old.update(worker_id="gpu-3", kv_free_bytes=10**9)
    old.pop("kv_capacity_bytes", None)
    old.pop("kv_format")
    view.on_record(old)
    assert view.states(now, {}, {})["gpu"].worker_kv_capacity_bytes is None
    assert view.states(now, {}, {})["gpu"].kv_format is None
