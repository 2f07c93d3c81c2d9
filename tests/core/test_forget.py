"""A finished job's requests leave the core's state and its store in slices of
``forget_per_step``: the event that says the job's output is whole (its tracker's final state,
``JobEnded``) forgets one slice, each tick after one more,
so forgetting a large job never holds the control plane's event loop for long. A restart finishes
what a stop left unforgotten. The job itself leaves ``finished_job_ttl_s`` after it finished,
once its requests are gone (bounded state: the dispatcher's jobs are the recent ones)."""

from __future__ import annotations

import pytest

from phaseroute.schemas.enums import JobState
from phaseroute.streams.core import ControlCore, CoreConfig, Dispatch, FleetObserved, Forget, JobEnded, ProfilesUpdated, ResultReceived
from phaseroute.streams.policy import ModelSpec

from .fleet import MODEL, admit, core, job, pool, table


def _finish_all_but_the_receipt(c: ControlCore, job_id: str, n: int, now: float) -> float:
    done = 0
    while done < n:
        now += 0.25
        c.handle(FleetObserved((pool("a", now), pool("b", now))), now)
        for d in c.tick(now):
            if isinstance(d, Dispatch):
                c.handle(ResultReceived(d.work.request_id, job_id, True, d.work.prompt_tokens, 8), now)
                done += 1
    return now


def _completed_whole(job_id: str, n: int) -> JobEnded:
    """The tracker's word that the job is COMPLETED with a line for each of its ``n`` requests."""
    return JobEnded(job_id, JobState.COMPLETED, None, n, 0, n)


def _whole(job_id: str, n: int, per_step: int, now: float, ttl: float = 3600.0) -> tuple[ControlCore, float]:
    """A core whose job of ``n`` requests has every result read and its whole output written."""
    c = core(now, forget_per_step=per_step, finished_job_ttl_s=ttl)
    admit(c, job(job_id, n, now), now)
    now = _finish_all_but_the_receipt(c, job_id, n, now)
    c.handle(_completed_whole(job_id, n), now)
    return c, now


def test_a_finished_job_is_forgotten_a_slice_per_tick() -> None:
    now = 1000.0
    c = core(now, forget_per_step=4)
    admit(c, job("big", 10, now), now)
    now = _finish_all_but_the_receipt(c, "big", 10, now)
    assert len(c.store.requests) == 10

    completing = c.handle(_completed_whole("big", 10), now)
    assert c.jobs.jobs["big"].state.name == "COMPLETED"
    slices = [d.request_ids for d in completing if isinstance(d, Forget)]
    assert [len(s) for s in slices] == [4] and len(c.store.requests) == 6  # tombstones for the slice only
    for _ in range(2):
        now += 0.25
        slices += [d.request_ids for d in c.tick(now) if isinstance(d, Forget)]
    assert [len(s) for s in slices] == [4, 4, 2]
    assert len({rid for s in slices for rid in s}) == 10  # each request once
    assert not c.store.requests and not c.dispatch.requests and "big" not in c.dispatch.by_job
    now += 0.25
    assert not [d for d in c.tick(now) if isinstance(d, Forget)]  # nothing left, nothing more


def test_a_late_result_while_its_job_is_being_forgotten_changes_nothing() -> None:
    c, now = _whole("j", 6, 3, 1000.0)
    left = next(iter(c.dispatch.requests))  # one not forgotten yet
    record = c.jobs.jobs["j"]
    before = (record.state, record.done, record.failed)
    assert c.handle(ResultReceived(left, "j", False, 50, 0), now) == []  # a copy's late failure
    assert (record.state, record.done, record.failed) == before


def test_a_restart_forgets_what_a_stop_left_of_a_finished_job() -> None:
    first, now = _whole("j", 10, 4, 1000.0)
    assert len(first.store.requests) == 6  # the stop comes before the next tick

    again = ControlCore(CoreConfig(models={MODEL: ModelSpec(MODEL, 4096)}, forget_per_step=4), first.store, seed=1)
    again.handle(FleetObserved((pool("a", now), pool("b", now))), now)
    again.handle(ProfilesUpdated(table(["a", "b"], now)), now)
    forgotten = [len(d.request_ids) for d in again.restore(now + 1) if isinstance(d, Forget)]
    forgotten += [len(d.request_ids) for d in again.tick(now + 1.25) if isinstance(d, Forget)]
    assert forgotten == [4, 2] and not first.store.requests and not again.dispatch.requests


def test_a_job_done_with_leaves_the_dispatcher_after_its_ttl_its_record_tombstoned() -> None:
    c, ended = _whole("j", 4, 4, 1000.0, ttl=60.0)
    assert not c.dispatch.requests and "j" in c.store.jobs
    c.tick(ended + 59)
    assert "j" in c.jobs.jobs and "j" in c.store.jobs, "kept for the ttl"
    c.tick(ended + 61)
    assert "j" not in c.jobs.jobs and "j" not in c.store.jobs and not c.jobs.dropped
    assert c.handle(_completed_whole("j", 4), ended + 62) == []  # a replayed final state: nothing to do
    assert "j" not in c.jobs.jobs and "j" not in c.store.jobs


def test_a_job_stays_while_its_requests_are_still_being_forgotten() -> None:
    c, ended = _whole("slow", 6, 1, 1000.0, ttl=1.0)  # one request forgotten per step
    c.tick(ended + 1.5)  # ttl passed; 4 requests still held
    assert "slow" in c.jobs.jobs and len(c.dispatch.requests) == 4
    for step in range(4):
        c.tick(ended + 2 + step * 0.25)
    assert not c.dispatch.requests and "slow" in c.jobs.jobs, "looked at again a ttl after it was held"
    c.tick(ended + 2.75 + 1.0)
    assert "slow" not in c.jobs.jobs and "slow" not in c.store.jobs


def test_a_restart_drops_a_job_done_with_once_its_ttl_passed() -> None:
    first, ended = _whole("j", 4, 4, 1000.0, ttl=60.0)
    assert first.store.jobs["j"]["finished_at"] == ended
    config = CoreConfig(models={MODEL: ModelSpec(MODEL, 4096)}, finished_job_ttl_s=60.0)
    again = ControlCore(config, first.store, seed=1)
    again.restore(ended + 30)
    again.tick(ended + 59)
    assert "j" in again.jobs.jobs, "the ttl counts from when it finished, not from the restart"
    again.tick(ended + 61)
    assert "j" not in again.jobs.jobs and "j" not in first.store.jobs


def test_forget_per_step_below_one_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="forget_per_step"):
        CoreConfig(forget_per_step=0)
