"""The tracker takes verdicts reached elsewhere (the live admission desks): ``JobAdmitted``.

A desk sends its verdict before the job's requests, but the tracker reads ``jobs.admissions``
apart from ``requests.pending`` and ``results``: a job's requests, results, receipts and cancel
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
    OutputWritten,
    QueueRequest,
    ResultReceived,
    judge,
)

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
    admitted, queued = _verdict_elsewhere(c, "j", 6, now)
    for q in queued:  # the requests come first
        c.handle(q.request, now)
    dispatched = _dispatch_all(c, now)
    assert len(dispatched) == 6
    for d in dispatched:
        assert c.handle(ResultReceived(d.work.request_id, "j", True, d.work.prompt_tokens, 8), now) == []
    assert c.handle(OutputWritten("j", 6), now) == []  # the sink wrote every line; still no verdict here
    assert "j" not in c.jobs.jobs and len(c.dispatch.requests) == 6  # nothing forgotten, nothing counted

    out = c.handle(admitted, now + 1)
    job_now = c.jobs.jobs["j"]
    assert job_now.state is JobState.COMPLETED and (job_now.done, job_now.failed, job_now.tokens_out) == (6, 0, 48)
    assert (job_now.prefill_left, job_now.decode_left) == (0, 0) and "j" not in c.jobs.open  # left the backlog
    kinds = [d.kind.name for d in out if hasattr(d, "kind")]
    assert kinds.count("COMPLETED") == 1 and "RUNNING" in kinds
    assert c.admissions_through == now

    assert c.handle(admitted, now + 2) == []  # the verdict read again
    assert c.jobs.jobs["j"].done == 6


def test_a_verdict_read_before_its_requests_tracks_them_as_the_core_always_did() -> None:
    now = 1000.0
    c = core(now)
    admitted, queued = _verdict_elsewhere(c, "j", 3, now)
    assert c.handle(admitted, now) == []
    assert c.jobs.backlog()[0].prefill_tokens == 150  # the next verdicts count it
    for q in queued:
        c.handle(q.request, now)
    for d in _dispatch_all(c, now):
        c.handle(ResultReceived(d.work.request_id, "j", True, d.work.prompt_tokens, 8), now)
    c.handle(OutputWritten("j", 3), now)
    assert c.jobs.jobs["j"].state is JobState.COMPLETED and not c.jobs.backlog()


def test_a_cancel_before_the_verdict_is_applied_when_the_verdict_comes() -> None:
    now = 1000.0
    c = core(now)
    admitted, queued = _verdict_elsewhere(c, "j", 4, now)
    for q in queued:
        c.handle(q.request, now)
    assert c.handle(CancelRequested("j", "acme", "not needed"), now) == []
    out = c.handle(admitted, now)
    assert c.jobs.jobs["j"].state is JobState.CANCELLED
    assert sum(isinstance(d, FailRequest) for d in out) == 4  # every queued request ends, with its line to come


def test_events_of_a_job_that_never_comes_are_dropped_after_their_ttl() -> None:
    now = 1000.0
    c = core(now, early_event_ttl_s=60.0)
    c.handle(CancelRequested("nobody", "acme", "?"), now)
    c.tick(now + 30)
    assert "nobody" in c._early
    c.tick(now + 61)
    assert "nobody" not in c._early


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
