"""The tracker and the dispatcher's backlog take verdicts reached elsewhere (the live admission
desks): ``JobAdmitted``.

A desk sends its verdict before the job's requests, but ``jobs.admissions`` is read apart from
``requests.pending``, ``results`` and ``results.written``: a job's requests, results, receipts and cancel
may all come before its verdict. Nothing of them is lost, nothing counts twice, and a verdict
read again changes nothing.
"""

from __future__ import annotations

from phaseroute.schemas.enums import JobState
from phaseroute.streams.core import (
    CancelRequested,
    ControlCore,
    Dispatch,
    FailRequest,
    JobAdmitted,
    JobTracker,
    OutputWritten,
    QueueRequest,
    ResultReceived,
    judge,
)
from phaseroute.streams.core.one_process import OneProcessControl

from .fleet import core, job


def _verdict_elsewhere(c: ControlCore, job_id: str, n: int, now: float) -> tuple[JobAdmitted, list[QueueRequest]]:
    """What a desk decides for the job, judged against this core's backlog and fleet, without
    telling this core (the verdict and the queued requests)."""
    d = c.dispatch
    verdict = judge(job(job_id, n, now), None, c.jobs.backlog(), d.fleet.states(), d.table, c.quotas, c.config, now)
    assert verdict.fresh and verdict.job.state is JobState.ADMITTED
    return JobAdmitted(verdict.job, now), [q for q in verdict.decisions if isinstance(q, QueueRequest)]


def _dispatch_all(c: ControlCore, now: float) -> list[Dispatch]:
    out = []
    for _ in range(10):
        now += 0.25
        out += [d for d in c.tick(now) if isinstance(d, Dispatch)]
    return out


def test_results_and_the_whole_output_read_before_the_verdict_complete_the_job_once_it_is_read() -> None:
    now = 1000.0
    c = core(now)
    control = OneProcessControl(c)
    admitted, queued = _verdict_elsewhere(c, "j", 6, now)
    for q in queued:  # the requests come first
        control.handle(q.request, now)
    dispatched = _dispatch_all(c, now)
    assert len(dispatched) == 6
    for d in dispatched:
        assert control.handle(ResultReceived(d.work.request_id, "j", True, d.work.prompt_tokens, 8), now) == []
    assert control.handle(OutputWritten("j", 6, 6, 0, 300, 48), now) == []  # every line written; no verdict yet
    assert "j" not in control.tracker.jobs and "j" not in c.jobs.jobs and len(c.dispatch.requests) == 6

    out = control.handle(admitted, now + 1)
    job_now = control.tracker.jobs["j"]
    assert job_now.state is JobState.COMPLETED and (job_now.done, job_now.failed, job_now.tokens_out) == (6, 0, 48)
    backlog = c.jobs.jobs["j"]
    assert (backlog.prefill_left, backlog.decode_left) == (0, 0) and "j" not in c.jobs.open  # left the backlog
    assert backlog.state is JobState.COMPLETED and not c.dispatch.requests  # the whole job's requests forgotten
    kinds = [d.kind.name for d in out if hasattr(d, "kind")]
    assert kinds.count("COMPLETED") == 1 and "RUNNING" in kinds
    assert c.admissions_through == now

    assert control.handle(admitted, now + 2) == []  # the verdict read again
    assert control.tracker.jobs["j"].done == 6


def test_a_verdict_read_before_its_requests_tracks_them_as_the_core_always_did() -> None:
    now = 1000.0
    c = core(now)
    control = OneProcessControl(c)
    admitted, queued = _verdict_elsewhere(c, "j", 3, now)
    assert control.handle(admitted, now) == []
    assert c.jobs.backlog()[0].prefill_tokens == 150  # the next verdicts count it
    for q in queued:
        control.handle(q.request, now)
    for d in _dispatch_all(c, now):
        control.handle(ResultReceived(d.work.request_id, "j", True, d.work.prompt_tokens, 8), now)
    control.handle(OutputWritten("j", 3, 3, 0, 150, 24), now)
    assert control.tracker.jobs["j"].state is JobState.COMPLETED and not c.jobs.backlog()


def test_a_cancel_before_the_verdict_is_applied_when_the_verdict_comes() -> None:
    now = 1000.0
    c = core(now)
    control = OneProcessControl(c)
    admitted, queued = _verdict_elsewhere(c, "j", 4, now)
    for q in queued:
        control.handle(q.request, now)
    assert control.handle(CancelRequested("j", "acme", "not needed"), now) == []
    out = control.handle(admitted, now)
    assert control.tracker.jobs["j"].state is JobState.CANCELLED and c.jobs.jobs["j"].state is JobState.CANCELLED
    assert sum(isinstance(d, FailRequest) for d in out) == 4  # every queued request ends, with its line to come


def test_events_of_a_job_that_never_comes_are_dropped_after_their_ttl() -> None:
    now = 1000.0
    tracker = JobTracker(core(now, early_event_ttl_s=60.0).config)
    tracker.handle(CancelRequested("nobody", "acme", "?"), now)
    tracker.tick(now + 30)
    assert "nobody" in tracker._early
    tracker.tick(now + 61)
    assert "nobody" not in tracker._early


def test_a_rejected_verdict_is_kept_for_its_ids_history_and_opens_no_backlog() -> None:
    now = 1000.0
    c = core(now)
    d = c.dispatch
    verdict = judge(job("j", 2, now, deadline_s=-10.0), None, [], d.fleet.states(), d.table, c.quotas, c.config, now)
    assert verdict.job.state is JobState.REJECTED
    c.handle(JobAdmitted(verdict.job, now), now)
    assert c.jobs.jobs["j"].state is JobState.REJECTED and not c.jobs.backlog()
    again = judge(job("j", 2, now), c.jobs.jobs["j"], [], d.fleet.states(), d.table, c.quotas, c.config, now)
    assert again.fresh and again.job.submissions == 2  # a rejected id is judged again, as its next submission


def test_a_tracker_drops_a_job_done_with_after_its_ttl_and_tombstones_it() -> None:
    """Bounded state: a finished job whose output is whole leaves the tracker ``finished_job_ttl_s``
    after it finished (its changelog record becomes a tombstone); an unfinished one stays."""
    now = 1000.0
    c = core(now, finished_job_ttl_s=60.0)
    tracker = JobTracker(c.config)
    done, running = (_verdict_elsewhere(c, job_id, 2, now)[0] for job_id in ("done", "running"))
    tracker.handle(done, now)
    tracker.handle(running, now)
    tracker.handle(OutputWritten("done", 2, 2, 0, 100, 16), now + 1)
    tracker.handle(OutputWritten("running", 1, 1, 0, 50, 8), now + 1)
    assert tracker.jobs["done"].state is JobState.COMPLETED
    assert set(tracker.changed_records()) == {"done", "running"}
    tracker.tick(now + 60)
    assert "done" in tracker.jobs, "kept for the ttl"
    tracker.tick(now + 62)
    assert set(tracker.jobs) == {"running"} and tracker.changed_records() == {"done": None}
    assert tracker.handle(OutputWritten("done", 2, 2, 0, 100, 16), now + 63) == []  # a late replay waits, then goes
    tracker.tick(now + 63 + c.config.early_event_ttl_s + 1)
    assert not tracker._early and "done" not in tracker.jobs
