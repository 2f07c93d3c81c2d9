"""The worker's lag probe: the broker is asked on the probe's thread, never on the caller's, and
a failed ask keeps the last answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from phaseroute.consumers.lag_probe import LagProbe


def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the probe did not answer in time"
        time.sleep(0.01)


def test_the_probe_asks_on_its_own_thread_and_keeps_the_last_answer_through_failures() -> None:
    answers: list[int | Exception] = [7, RuntimeError("broker gone"), 9]
    asked_on: list[str] = []

    def read_lag() -> int:
        asked_on.append(threading.current_thread().name)
        answer = answers.pop(0) if answers else 9
        if isinstance(answer, Exception):
            raise answer
        return answer

    probe = LagProbe(read_lag, interval_s=0.02, name="lag-test")
    assert probe.lag == 0  # nothing asked before it starts
    probe.start()
    wait_for(lambda: len(asked_on) >= 2)
    assert probe.lag == 7  # the failed ask kept it
    wait_for(lambda: probe.lag == 9)
    probe.stop()
    assert set(asked_on) == {"lag-test"}
    asked = len(asked_on)
    time.sleep(0.1)
    assert len(asked_on) == asked  # stopped: no more asks


def test_a_slow_broker_never_holds_the_reader() -> None:
    release = threading.Event()
    probe = LagProbe(lambda: 3 if release.wait(5) else 0, interval_s=0.01)
    probe.start()
    started = time.monotonic()
    assert probe.lag == 0 and time.monotonic() - started < 0.05  # the ask is still waiting
    release.set()
    wait_for(lambda: probe.lag == 3)
    probe.stop()


def test_a_non_positive_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s must be > 0, got 0"):
        LagProbe(lambda: 0, interval_s=0)
