"""Fault injection: an executor made N times slower at run time (a stand-in for a slower or
degraded accelerator, which this machine does not have).

The factor is read from a file (re-read at most once a second), so a test or an operator can
slow a live worker without telling anyone else: ``echo 4 > FILE``. Each prefill batch (or chunk) and each
decode step sleeps ``(factor - 1) x`` its own duration, inside the time the worker measures, so
telemetry sees the slowdown exactly as it would see slower hardware.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


class SlowdownFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._factor, self._read_at = 1.0, 0.0

    def factor(self) -> float:
        now = time.monotonic()
        if now - self._read_at >= 1.0:
            self._read_at = now
            try:
                value = float(self.path.read_text().strip() or 1.0)
                self._factor = value if value >= 1.0 else 1.0
            except (OSError, ValueError):
                self._factor = 1.0
        return self._factor

    def stretch(self, started: float) -> float:
        """Sleep ``(factor - 1)`` times the time since ``started``; the seconds slept."""
        extra = (self.factor() - 1.0) * (time.perf_counter() - started)
        if extra > 0:
            time.sleep(extra)
        return max(extra, 0.0)


class ThrottledSession:
    def __init__(self, inner: Any, slowdown: SlowdownFile) -> None:
        self._inner, self._slowdown = inner, slowdown

    def step(self) -> Any:
        started = time.perf_counter()
        finished = self._inner.step()
        self._slowdown.stretch(started)
        return finished

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ThrottledPrefillJob:
    def __init__(self, inner: Any, slowdown: SlowdownFile) -> None:
        self._inner, self._slowdown = inner, slowdown

    def advance(self, max_tokens: int | None = None) -> Any:
        started = time.perf_counter()
        results = self._inner.advance(max_tokens)
        # the job times its own compute (the worker's telemetry reads it): slower hardware would
        # have computed for longer, so the sleep counts as compute
        self._inner.compute_s += self._slowdown.stretch(started)
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ThrottledExecutor:
    """Proxies an executor; prefill and decode steps are stretched by the file's factor."""

    def __init__(self, inner: Any, factor_file: Path) -> None:
        self._inner = inner
        self._slowdown = SlowdownFile(factor_file)

    def prefill(self, items: list[Any]) -> list[Any]:
        started = time.perf_counter()
        results: list[Any] = self._inner.prefill(items)
        self._slowdown.stretch(started)
        return results

    def start_prefill(self, items: list[Any]) -> ThrottledPrefillJob:
        return ThrottledPrefillJob(self._inner.start_prefill(items), self._slowdown)

    def decode_session(self, *args: Any, **kwargs: Any) -> ThrottledSession:
        return ThrottledSession(self._inner.decode_session(*args, **kwargs), self._slowdown)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
