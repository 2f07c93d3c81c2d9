"""A job whose result counting broke half-way is recounted from its requests' own states, once
the sink's receipt says the whole output is written, and only then: a receipt of part of the
output (the sink is ahead of the control plane whenever it has a backlog) never makes the core
pass over the job's requests."""

from __future__ import annotations

import pytest

from phaseroute.streams.core import Dispatch, OutputWritten, Problem, ResultReceived
from tests.core.fleet import admit, core, job


def _dispatched(c, now: float) -> list[Dispatch]:
    return [d for d in c.tick(now) if isinstance(d, Dispatch)]


def test_a_broken_count_is_recounted_on_the_receipt_of_the_whole_output(monkeypatch: pytest.MonkeyPatch) -> None:
    now = 1000.0
    c = core(now)
    admit(c, job("j", 5, now), now)
    running = _dispatched(c, now + 0.1)
    assert len(running) == 5
    original, broke = c.jobs.on_result, []

    def breaks_once(*args: object, **kwargs: object) -> object:
        if not broke:
            broke.append(1)
            raise RuntimeError("injected into on_result")
        return original(*args, **kwargs)

    monkeypatch.setattr(c.jobs, "on_result", breaks_once)
    results = [ResultReceived(d.work.request_id, "j", True, d.work.prompt_tokens, 8) for d in running]
    first = c.handle(results[0], now + 0.2)
    assert [type(d) for d in first] == [Problem] and broke == [1]
    for r in results[1:4]:
        c.handle(r, now + 0.3)
    record = c.jobs.jobs["j"]
    assert record.done == 3  # four requests are DONE, one result's count was lost

    c.handle(OutputWritten("j", 4), now + 0.4)  # part of the output (the sink is ahead): no pass, no recount
    assert record.done == 3 and not record.state.is_finished
    c.handle(results[4], now + 0.5)
    assert record.done == 4 and not record.state.is_finished
    c.handle(OutputWritten("j", 5), now + 0.6)  # all of it: the requests' states are the truth
    assert (record.done, record.failed, record.state.name) == (5, 0, "COMPLETED")
    assert "j" not in c.dispatch.by_job  # and the finished job's requests are forgotten
