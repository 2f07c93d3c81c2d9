"""The throttle fault injection: a slowdown the worker's own timings (and so telemetry) see."""

from __future__ import annotations

import time
from pathlib import Path

from phaseroute.engine.throttle import ThrottledExecutor


class _Job:
    """A stand-in prefill job that computes for 20 ms per chunk and times it, as PrefillJob does."""

    def __init__(self) -> None:
        self.compute_s = 0.0

    def advance(self, max_tokens: int | None = None) -> list[str]:
        started = time.perf_counter()
        time.sleep(0.02)
        self.compute_s += time.perf_counter() - started
        return []


class _Executor:
    def start_prefill(self, items: list[str]) -> _Job:
        return _Job()


def test_a_throttled_prefill_job_reports_the_slowdown_as_compute(tmp_path: Path) -> None:
    factor = tmp_path / "factor"
    factor.write_text("4")
    job = ThrottledExecutor(_Executor(), factor).start_prefill(["r"])
    started = time.perf_counter()
    for _ in range(3):
        job.advance(64)
    wall = time.perf_counter() - started
    assert job.compute_s >= 0.2, f"4 x 3 x 20 ms of compute expected, the job reports {job.compute_s:.3f} s"
    assert job.compute_s <= wall + 1e-6
