"""The control plane's decisions between records: admission, idempotent resubmission, fairness
under a flood, retries away from a failing pool, cancellation, stragglers, pool loss, restarts.

These drive ``ControlShell`` (the live code path: Avro records in, sends out, the pure
``ControlCore`` between) without Faust; the Faust app only moves records between Kafka and the
shell. The pools are a fleet we do not have here, described by heartbeats and profile rows
(fakes for hardware, as the standards allow); the tokenizer is SmolLM2's real one.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from phaseroute.config import settings
from phaseroute.infra.blobstore import BlobStore, output_prefix
from phaseroute.schemas.ids import request_id
from phaseroute.streams.admission_desk import AdmissionDesk
from phaseroute.streams.core import ControlCore, DictStore
from phaseroute.streams.model_catalog import load_model_info
from phaseroute.streams.policy import CurvePoint, FairConfig, Phase, ProfileRow, ProfileSource
from phaseroute.streams.profiles.convert import row_to_avro
from phaseroute.streams.settings import core_config
from phaseroute.streams.shell import ControlShell
from phaseroute.streams.views import PoolView, ProfileView

MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def model_info():
    return load_model_info(MODEL, settings().model_cache)


def heartbeat(pool: str, phase: str, now: float, variant: str = "fp32", max_batch: int = 8) -> dict[str, Any]:
    return {"pool": pool, "worker_id": f"{pool}-0", "phase": phase, "variant": variant, "device": "cpu",
            "models": [MODEL], "queue_depth": 0, "consumer_lag": 0, "batch_in_flight": 0, "max_batch": max_batch,
            "memory_bytes": 10**9, "kv_free_bytes": 4 * 10**9, "kv_format": f"{MODEL}|float32|30x3x64|v1",
            "host": "test", "pid": 1, "status": "UP", "started_at": int((now - 60) * 1000), "interval_s": 2.0,
            "at": int(now * 1000)}


def profile(pool: str, phase: Phase, tokens_per_s: float, now: float, error_rate: float = 0.0,
            samples: int = 500, variant: str = "fp32") -> dict[str, Any]:
    row = ProfileRow(MODEL, phase, pool, variant, (CurvePoint(1, tokens_per_s / 4), CurvePoint(8, tokens_per_s)),
                     0.05, 0.08, 0.1, 46080.0, 46080.0, error_rate, 1.0, samples, now, ProfileSource.TELEMETRY)
    return row_to_avro(row, 900.0)


class Plane:
    """The control plane without Faust: an admission desk, and a shell over a core with dict
    tables, sharing the views. A submission goes the live way: the desk judges it against the
    shell's load snapshot, and the tracker takes the verdict from its ``jobs.admissions`` record."""

    def __init__(self, model_info, now: float, fair: FairConfig | None = None, store: DictStore | None = None,
                 prompts: dict | None = None, pools: PoolView | None = None, profiles: ProfileView | None = None,
                 blob_store: BlobStore | None = None):
        config = core_config({MODEL: model_info})
        if fair is not None:
            from dataclasses import replace
            config = replace(config, fair=fair)
        self.config = config
        self.store = store if store is not None else DictStore()
        self.core = ControlCore(config, self.store, seed=1, write_behind=True)  # as the Faust app runs it
        self.pools, self.profiles = pools or PoolView(config.heartbeat_timeout_s), profiles or ProfileView()
        self.shell = ControlShell(self.core, prompts if prompts is not None else {}, {MODEL: model_info},
                                  output_prefix, self.pools, self.profiles)
        self.desk = AdmissionDesk("desk-test", config, {MODEL: model_info}, self.pools, self.profiles, output_prefix,
                                  blob_store)

    def submit(self, record: dict[str, Any], now: float) -> list:
        self.desk.on_load(self.shell.load("dispatcher-test", now).record)
        verdict, requests = self.desk.submitted(record, self.desk.intake(record), now)
        sends = list(verdict)
        for s in verdict:
            if s.topic == "jobs.admissions":
                sends += self.shell.on_record("job_admission", s.record, now)
        return sends + list(requests)

    def record(self, kind: str, record: dict[str, Any], now: float) -> list:
        return self.shell.on_record(kind, record, now)

    def tick(self, now: float) -> list:
        return self.shell.tick(now)

    def job(self, job_id: str) -> dict[str, Any]:
        return self.core.jobs.jobs[job_id].to_record()

    def requests(self, tenant: str | None = None) -> list:
        return [r for r in self.core.dispatch.requests.values() if tenant is None or r.work.tenant == tenant]


def plane(model_info, pools: dict[str, str], now: float, fair: FairConfig | None = None,
          speed: dict[str, float] | None = None) -> Plane:
    cp = Plane(model_info, now, fair)
    for name, phase in pools.items():
        cp.pools.on_record(heartbeat(name, phase, now))
        phases = [Phase.PREFILL, Phase.DECODE] if phase == "BOTH" else [Phase(phase)]
        for ph in phases:
            base = 500.0 if ph is Phase.PREFILL else 150.0
            cp.profiles.on_record(profile(name, ph, base * (speed or {}).get(name, 1.0), now))
    return cp


def job(job_id: str, tenant: str, n: int, deadline_s: float, now: float, max_tokens: int = 16) -> dict[str, Any]:
    return {"job_id": job_id, "tenant": tenant, "priority": 1, "submitted_at": int(now * 1000),
            "deadline": int((now + deadline_s) * 1000), "model": MODEL, "quality_tier": "EXACT", "quality_tolerance": None,
            "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens},
            "requests": [{"custom_id": f"{tenant}-{i}", "prompt": None, "max_tokens": max_tokens,
                          "messages": [{"role": "user", "content": f"Question number {i}: what is {i} plus {i}?"}]}
                         for i in range(n)], "input_file": None, "output_file": None, "metadata": {}}


def admit_all(cp: Plane, record: dict[str, Any], now: float) -> list:
    sends = cp.submit(record, now)
    for s in sends:
        if s.topic == "requests.pending":
            cp.record("request", s.record, now)
    return sends


def result_of(work: dict[str, Any], now: float, tokens: int = 16, status: str = "OK") -> dict[str, Any]:
    return {"request_id": work["request_id"], "job_id": work["job_id"], "tenant": work["tenant"], "status": status,
            "prompt_tokens": work["prompt_tokens"], "completion_tokens": tokens, "at": int(now * 1000)}


def finish(cp: Plane, work: dict[str, Any], now: float, tokens: int = 16, receipt: bool = True) -> list:
    """A result for the work; with ``receipt``, also the result sink's receipt for the lines it wrote."""
    sends = cp.record("result", result_of(work, now, tokens), now)
    if receipt:
        entry = cp.job(work["job_id"])
        sends += written(cp, work["job_id"], entry["done"] + entry["failed"], now)
    return sends


def written(cp: Plane, job_id: str, lines: int, now: float) -> list:
    return cp.record("output_written", {"job_id": job_id, "lines": lines, "path": f"/tmp/results/{job_id}.jsonl",
                                        "writer": "result-sink.test", "at": int(now * 1000)}, now)


def failed(work: dict[str, Any], pool: str, t: float, error: str = "device lost") -> dict[str, Any]:
    return {"attempt_id": work["attempt_id"], "request_id": work["request_id"], "job_id": work["job_id"],
            "tenant": work["tenant"], "attempt": work["attempt"], "phase": "PREFILL", "pool": pool,
            "worker_id": f"{pool}-0", "error_class": "RuntimeError", "error": error, "retryable": True,
            "at": int(t * 1000)}


def states(sends: list) -> list[str]:
    return [s.record["state"] for s in sends if s.topic == "jobs.events"]


def prefill(sends: list) -> list:
    return [s for s in sends if s.topic.startswith("prefill.")]


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


def test_cancel_fails_every_open_request_once_and_the_job_ends_when_its_output_is_whole(model_info) -> None:
    """Cancel: CANCELLED at once; queued requests leave the fair queue; every request not yet
    finished gets exactly one failed result with batch_cancelled (a line in the error file); the
    job's counters go on, and a last CANCELLED event says when its output is whole."""
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    admit_all(cp, job("j-c", "acme", 50, 3600, now), now)
    first = [s.record for s in prefill(cp.tick(now + 0.5))]
    assert 0 < len(first) < 50
    done = first[0]
    finish(cp, done, now + 0.8, receipt=False)
    cancel = {"job_id": "j-c", "tenant": "acme", "command": "CANCEL", "at": 0, "reason": "changed my mind"}
    assert cp.record("job_command", dict(cancel, tenant="mallory"), now + 0.9) == [], "another tenant's cancel"
    sends = cp.record("job_command", cancel, now + 1)
    assert states(sends) == ["CANCELLED"]
    failures = [s.record for s in sends if s.topic == "results"]
    assert len(failures) == 49 and {f["error_code"] for f in failures} == {"batch_cancelled"}
    assert done["request_id"] not in {f["request_id"] for f in failures}
    assert not prefill(cp.tick(now + 2)), "nothing of a cancelled job is dispatched"
    for record in failures:  # the failed results come back from the results topic
        cp.record("result", record, now + 3)
    cp.record("result", result_of(first[1], now + 3), now + 3)  # a running attempt finished late: ignored
    assert cp.job("j-c")["failed"] == 49 and cp.job("j-c")["done"] == 1
    last = written(cp, "j-c", 50, now + 4)
    assert states(last) == ["CANCELLED"] and cp.core.dispatch.by_job.get("j-c") is None


def test_requests_of_a_cancelled_job_read_after_the_cancel_end_at_once_and_keep_no_text(model_info) -> None:
    """A big job cancelled while most of its requests are still on requests.pending: each one read
    later gets its one batch_cancelled line, is never dispatched, and its prompt is not stored."""
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    pending = [s.record for s in cp.submit(job("j-late", "acme", 20, 3600, now), now) if s.topic == "requests.pending"]
    for record in pending[:5]:
        cp.record("request", record, now)
    cancel = {"job_id": "j-late", "tenant": "acme", "command": "CANCEL", "at": 0, "reason": "too big"}
    assert states(cp.record("job_command", cancel, now + 1)) == ["CANCELLED"]
    late = [s for record in pending[5:] for s in cp.record("request", record, now + 2)]
    assert [s.record["error_code"] for s in late if s.topic == "results"] == ["batch_cancelled"] * 15
    assert not set(cp.shell.prompts) & {r["request_id"] for r in pending[5:]}, "no text kept for a request that cannot run"
    assert not prefill(cp.tick(now + 3))


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


def test_job_completes_only_when_the_sink_has_written_every_line(model_info) -> None:
    """Every result counted is not enough: COMPLETED waits for the sink's receipt that the
    output file holds a line per request, so a reader of the final event finds the file whole."""
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    admit_all(cp, job("j-w", "acme", 3, 3600, now), now)
    works = [s.record for s in prefill(cp.tick(now + 0.1))]
    assert len(works) == 3
    sends = []
    for i, work in enumerate(works):
        sends += finish(cp, work, now + 1 + i, receipt=False)
    assert "COMPLETED" not in states(sends) and cp.job("j-w")["state"] == "RUNNING"
    assert written(cp, "j-w", 2, now + 5) == [] and cp.job("j-w")["state"] == "RUNNING"
    assert states(written(cp, "j-w", 3, now + 6)) == ["COMPLETED"]
    assert cp.job("j-w")["finished_at"] == now + 6
    assert written(cp, "j-w", 3, now + 7) == [], "a replayed receipt changes nothing"
    assert not cp.requests() and not cp.shell.prompts, "a finished job's requests and texts are forgotten"


def test_a_receipt_ahead_of_the_last_result_completes_the_job_on_that_result(model_info) -> None:
    """Receipts and results come on different topics: either may be the last to arrive, and a
    replayed receipt with an older count never lowers what is known to be written."""
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    admit_all(cp, job("j-r", "acme", 2, 3600, now), now)
    works = [s.record for s in prefill(cp.tick(now + 0.1))]
    finish(cp, works[0], now + 1, receipt=False)
    written(cp, "j-r", 2, now + 2)
    written(cp, "j-r", 1, now + 3)  # an older receipt, replayed
    assert cp.job("j-r")["lines_written"] == 2 and cp.job("j-r")["state"] == "RUNNING"
    assert "COMPLETED" in states(finish(cp, works[1], now + 4, receipt=False))


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
    assert states(written(cp, "j-strand", 3, now + 1901)) == ["FAILED"]


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
