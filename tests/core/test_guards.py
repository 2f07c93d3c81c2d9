"""One bad event or request never stops the control core: an exception injected into each event
handler and into each step of the tick becomes a ``Problem`` (the shell dead-letters it), and the
job still finishes; an exception while placing one request fails that attempt (it is retried, and
gives up with the reason when the bug stays)."""

from __future__ import annotations

import pytest

from phaseroute.schemas.enums import Phase
from phaseroute.streams.core import (
    AttemptFailed,
    CancelRequested,
    Dispatch,
    FailRequest,
    KvReady,
    Problem,
    ProfilesUpdated,
    ResultReceived,
)
from phaseroute.streams.policy import FailureKind
from tests.core.fleet import admit, control_of, core, job, run_to_completion

HANDLERS = ("_submitted", "_queued", "_kv_ready", "_result", "_attempt_failed", "_job_ended", "_cancel",
            "_fleet", "_profiles")


class Boom(RuntimeError):
    pass


def fail_once(target: object, name: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make ``target.name`` raise on its first call only; returns a list that counts the raises."""
    original = getattr(target, name)
    raised: list[int] = []

    def once(*args: object, **kwargs: object) -> object:
        if not raised:
            raised.append(1)
            raise Boom(f"injected into {name}")
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, once)
    return raised


def poke(c, handler: str, now: float) -> list:
    """An event that reaches ``handler`` (for the handlers the normal run does not reach)."""
    running = next(d for d in c.tick(now) if isinstance(d, Dispatch))
    w = running.work
    event = {
        "_kv_ready": KvReady(w.request_id, running.attempt, running.prefill_pool, "kvstore"),
        "_attempt_failed": AttemptFailed(w.request_id, running.attempt, running.prefill_pool, Phase.PREFILL,
                                         FailureKind.ERROR, "worker error"),
        "_cancel": CancelRequested("another-job", "acme", "nope"),
        "_profiles": ProfilesUpdated(c.dispatch.table),
    }[handler]
    return c.handle(event, now)


@pytest.mark.parametrize("handler", HANDLERS)
def test_an_exception_in_any_handler_is_a_problem_and_the_job_still_finishes(handler: str, monkeypatch) -> None:
    now = 1000.0
    c = core(now)
    raised = fail_once(c, handler, monkeypatch)
    c._handlers = {k: getattr(c, v.__name__) for k, v in c._handlers.items()}  # the patched methods
    first = admit(c, job("j", 6, now), now)
    if handler == "_submitted":
        assert [type(d) for d in first] == [Problem] and "injected into _submitted" in first[0].reason
        admit(c, job("j", 6, now), now)  # the producer's retry of the dead-lettered job runs
    if handler in ("_kv_ready", "_attempt_failed", "_cancel", "_profiles"):
        out = poke(c, handler, now + 0.1)
        assert [type(d) for d in out] == [Problem] and "Boom" in out[0].reason
    control = control_of(c, "j", now)
    run_to_completion(control, "j", now + 0.1, pending=first)
    assert raised == [1], "the injection never ran"
    record = control.tracker.jobs["j"]
    if handler == "_queued":  # that request could not be taken: it ends failing, with the reason
        assert (record.state.name, record.done, record.failed) == ("COMPLETED", 5, 1)
    else:
        assert (record.state.name, record.done) == ("COMPLETED", 6)


@pytest.mark.parametrize("step", ("_forget_some", "release"))
def test_an_exception_in_a_tick_step_is_a_problem_and_the_next_tick_goes_on(step: str, monkeypatch) -> None:
    now = 1000.0
    c = core(now)
    admit(c, job("j", 4, now), now)
    target = c.dispatch if step == "release" else c
    fail_once(target, step, monkeypatch)
    out = c.tick(now + 0.25)
    problems = [d for d in out if isinstance(d, Problem)]
    assert len(problems) == 1 and problems[0].where.startswith("tick/") and "Boom" in problems[0].reason
    assert run_to_completion(c, "j", now + 0.25) > now


@pytest.mark.parametrize("function", ("requeue_due", "redispatch_dead_pools", "speculate"))
def test_an_exception_in_a_recovery_step_does_not_stop_release(function: str, monkeypatch) -> None:
    import phaseroute.streams.core.recovery as recovery

    now = 1000.0
    c = core(now)
    admit(c, job("j", 4, now), now)
    fail_once(recovery, function, monkeypatch)
    out = c.tick(now + 0.25)
    assert any(isinstance(d, Problem) for d in out) and any(isinstance(d, Dispatch) for d in out)


def test_a_request_whose_placement_raises_is_retried_then_fails_with_the_reason(monkeypatch) -> None:
    """Placing one request raises every time: the other requests run; that one is retried as a
    failed attempt and gives up with the exception in its failed result; the job still ends."""
    now = 1000.0
    c = core(now)
    admit(c, job("j", 3, now), now)
    bad = next(iter(sorted(c.dispatch.requests)))
    original = c.dispatch.route

    def route(work, *args, **kwargs):  # type: ignore[no-untyped-def]
        if work.request_id == bad:
            raise Boom("this request's data breaks the router")
        return original(work, *args, **kwargs)

    monkeypatch.setattr(c.dispatch, "route", route)
    failed: list[FailRequest] = []
    t = now
    for _ in range(2000):
        t += 0.5
        for d in c.tick(t):
            if isinstance(d, Dispatch):
                c.handle(ResultReceived(d.work.request_id, "j", True, 50, 8), t)
            elif isinstance(d, FailRequest):
                failed.append(d)
                c.handle(ResultReceived(d.work.request_id, "j", False, 50, 0), t)
        if failed:
            break
    assert [f.work.request_id for f in failed] == [bad]
    assert "this request's data breaks the router" in failed[0].reason and failed[0].code == "request_failed"
    assert sorted(state.status.name for state in c.dispatch.requests.values()) == ["DONE", "DONE", "FAILED"]
