"""Deterministic simulation testing of the control core: a fixed set of seeds (over 100,000
requests in all) holds every invariant under injected faults; the harness catches bugs planted
in the core; a failing log replays exactly and shrinks to a short one."""

from __future__ import annotations

import random

import pytest

from phaseroute.sim.dst import Harness, SeedFailure, replay, run_seed, scenario_for
from phaseroute.sim.dst import scenario as sc

SEEDS = range(26)


def test_the_fixed_seeds_cover_over_100k_requests() -> None:
    total = sum(len(job.prompts) for seed in SEEDS for _, job, _ in sc.jobs(scenario_for(seed),
                                                                           random.Random(seed)))
    assert total >= 100_000, total


@pytest.mark.parametrize("seed", SEEDS)
def test_seed_holds_every_invariant(seed: int) -> None:
    outcome = run_seed(seed)  # raises SeedFailure with the shortest reproducing log
    assert outcome.admitted_jobs > 0 and outcome.dispatches >= outcome.requests * 0.5
    if seed % 4 == 3:  # the harsh seeds really are harsh
        assert outcome.restarts >= 5 and outcome.counts["pool_losses"] >= 5 and outcome.counts["duplicates"] > 500


def test_a_log_replays_to_the_same_core_state() -> None:
    harness = Harness(scenario_for(1, jobs=12))
    harness.run()
    assert replay(harness.log, harness.config, 1) is None


def _planted(monkeypatch: pytest.MonkeyPatch, target: object, name: str, bad: object) -> None:
    monkeypatch.setattr(target, name, bad)


def test_a_leaked_tenant_slot_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted bug: a finished request's slot is never given back."""
    from phaseroute.streams.policy import FairScheduler

    original = FairScheduler.on_finished

    def leaky(self, request_id, now, output_tokens=None):  # type: ignore[no-untyped-def]
        entry = self._running.get(request_id)
        result = original(self, request_id, now, output_tokens)
        if entry is not None and result:
            self._tenants[entry[0]].in_flight += 1  # forgets to free the slot
        return result

    _planted(monkeypatch, FairScheduler, "on_finished", leaky)
    with pytest.raises(SeedFailure) as failure:
        run_seed(0, jobs=10)
    assert failure.value.violation.invariant in ("counts", "slots_free", "every_request_ended")


def test_a_receipt_counted_twice_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted bug: the job tracker adds a replayed receipt's lines to the count again."""
    from phaseroute.schemas.enums import JobState
    from phaseroute.streams.core import JobTracker, OutputWritten

    original = JobTracker._written

    def counts_replays(self, ev, now):  # type: ignore[no-untyped-def]
        job = self.jobs.get(ev.job_id)
        if job is not None and job.state is JobState.RUNNING and 0 < ev.lines <= job.lines_written:
            ev = OutputWritten(ev.job_id, job.lines_written + ev.lines, job.done + ev.ok, job.failed + ev.failed,
                               job.tokens_in + ev.tokens_in, job.tokens_out + ev.tokens_out)
        return original(self, ev, now)

    _planted(monkeypatch, JobTracker, "_written", counts_replays)
    with pytest.raises(SeedFailure) as failure:
        run_seed(3, jobs=10)
    # the double count ends a job before all its requests did: the end finds its counts off, or its
    # requests still held
    assert failure.value.violation.invariant in ("jobs_final", "slots_free", "no_problem")


def test_exact_work_on_a_demoted_path_is_caught_and_its_log_shrinks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted bug: the router forgets the quality policy's verdict. The failing log replays to the
    same violation and shrinks to a small fraction of the run."""
    import phaseroute.streams.policy.router as router

    _planted(monkeypatch, router, "path_filter", lambda request, estimate, config, measured=None: None)
    with pytest.raises(SeedFailure) as failure:
        run_seed(2, jobs=10, shrink_budget_s=60.0)
    f = failure.value
    assert f.violation.invariant == "exact_quality"
    assert f.shortest is not None and len(f.shortest) < f.log_length / 4
    found = replay(f.shortest, sc.core_config(scenario_for(2), random.Random(2)), 2)
    assert found is not None and found.invariant == "exact_quality"


def test_work_lost_in_a_restart_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted bug: a restarted core forgets the requests that were waiting out a back-off."""
    from phaseroute.streams.core import RequestStatus, restoring

    original = restoring.restore_request

    def forgetful(d, state, config, now):  # type: ignore[no-untyped-def]
        if state.status is RequestStatus.BACKOFF:
            state.status = RequestStatus.RUNNING  # believes it runs: nobody will place it again
            state.attempts = []
        return original(d, state, config, now)

    _planted(monkeypatch, restoring, "restore_request", forgetful)
    caught = {}
    # seeds where the restarts find requests in back-off (most such restarts are healed by expiry),
    # with the store written after each event and written behind
    for seed, write_behind in ((7, False), (19, True), (39, True)):
        try:
            run_seed(seed, write_behind=write_behind)
        except SeedFailure as failure:
            caught[(seed, write_behind)] = failure.violation.invariant
    assert {wb for _, wb in caught} == {False, True}, caught
    assert set(caught.values()) <= {"every_request_ended", "jobs_final", "slots_free", "counts"}, caught
