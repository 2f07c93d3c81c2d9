"""A worker's consumer lag, read from the broker on a thread of its own.

The lag (messages in the worker's assigned partitions that it has not consumed yet) needs the
broker's high watermarks: one round trip per partition. Asked from the work loop, those round
trips stopped the worker's compute while they waited (measured with py-spy in a colocated
`bench pipeline` worker: 22% of the main thread's time in ``WorkerLoop.consumer_lag``). Here a
daemon thread asks every ``interval_s`` and keeps the last answer for the heartbeats; the work
loop never waits for the broker to know its lag.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class LagProbe:
    """``lag`` is the last answer of ``read_lag`` (0 until the first), refreshed every ``interval_s``."""

    def __init__(self, read_lag: Callable[[], int], interval_s: float, name: str = "lag-probe") -> None:
        if interval_s <= 0:
            raise ValueError(f"lag probe interval_s must be > 0, got {interval_s}")
        self.lag = 0
        self._read_lag, self.interval_s = read_lag, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.lag = self._read_lag()
            except Exception as exc:  # a slow or closing broker handle: keep the last answer
                log.debug("lag check failed: %s", exc)
            self._stop.wait(self.interval_s)
