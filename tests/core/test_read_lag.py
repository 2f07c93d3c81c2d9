"""Straggler checks allow for how late the core reads its results: an attempt that looks late
while the results the core reads are 60 s old may have finished already, and gets no copy until
it is late as of the newest finished work read; a core that reads results at once copies it."""

from __future__ import annotations

from phaseroute.streams.core import ControlCore, Dispatch, FleetObserved, ResultReceived
from phaseroute.streams.core.state import ReadLag

from .fleet import admit, core, job, pool


def _copies(c: ControlCore, now: float) -> list[Dispatch]:
    c.handle(FleetObserved((pool("a", now), pool("b", now))), now)
    return [d for d in c.tick(now) if isinstance(d, Dispatch) and d.speculative]


def _two_running(now: float) -> tuple[ControlCore, list[Dispatch]]:
    c = core(now)
    admit(c, job("j", 2, now), now)
    running = [d for d in c.tick(now + 0.1) if isinstance(d, Dispatch)]
    assert len(running) == 2
    return c, running


def _first_copy(c: ControlCore, start: float, until: float) -> float | None:
    t = start
    while t < until:
        t += 1.0
        if _copies(c, t):
            return t
    return None


def _copy_time(read_late_s: float, now: float = 1000.0) -> float | None:
    """When the second request's attempt gets a copy, after the first one's result is read at
    ``now + 1``, stamped by its worker as finished ``read_late_s`` before."""
    c, running = _two_running(now)
    done = running[0]
    c.handle(ResultReceived(done.work.request_id, "j", True, done.work.prompt_tokens, 8, now + 1 - read_late_s), now + 1)
    return _first_copy(c, now + 1, now + 400)


def test_an_attempt_is_copied_only_once_late_as_of_the_results_read() -> None:
    prompt = _copy_time(read_late_s=0.0)
    late = _copy_time(read_late_s=60.0)
    assert prompt is not None and late is not None, "the slow attempt is never copied"
    assert prompt < 1000.0 + 60.0, "the fake fleet's profile makes a copy due within a minute"
    assert late >= prompt + 30.0, (prompt, late)  # judged as of the newest result read, 60 s old then
    assert late <= prompt + 60.0 + 10.0, (prompt, late)  # and the lag counts down: copied all the same


def test_the_lag_counts_down_in_real_time_is_capped_and_never_negative() -> None:
    lag = ReadLag(cap_s=100.0)
    lag.observe(completed_at=940.0, now=1000.0)
    assert lag.at(1000.0) == 60.0 and lag.at(1030.0) == 30.0 and lag.at(1100.0) == 0.0
    lag.observe(completed_at=0.0, now=1000.0)
    assert lag.at(1000.0) == 100.0
    lag.observe(completed_at=1005.0, now=1000.0)  # a worker's clock ahead of the core's
    assert lag.at(1000.0) == 0.0
