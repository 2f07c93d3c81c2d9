"""What the control plane's dispatch ticks cost, logged every ``every_s`` seconds.

The Faust app times each tick of the core (``ControlShell.tick``, without the sends) and adds
it here with the number of requests waiting in the fair queues; every ``every_s`` one log
line gives the ticks' count, p50, p99 and max in milliseconds and the most requests queued
meanwhile (``LINE`` parses it back: ``phaseroute bench control`` reads it from the log).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
LINE = re.compile(r"dispatch ticks: (?P<n>\d+) in (?P<window>[\d.]+) s, p50 (?P<p50>[\d.]+) ms, "
                  r"p99 (?P<p99>[\d.]+) ms, max (?P<max>[\d.]+) ms; up to (?P<queued>\d+) requests queued")


@dataclass
class TickStats:
    every_s: float = 10.0
    _ms: list[float] = field(default_factory=list)
    _queued: int = 0
    _since: float | None = None

    def add(self, now: float, elapsed_s: float, queued: int) -> str | None:
        """Record one tick; the log line (also logged) when a window ended, else None."""
        if self._since is None:
            self._since = now
        self._ms.append(1000.0 * elapsed_s)
        self._queued = max(self._queued, queued)
        if now - self._since < self.every_s:
            return None
        ms = sorted(self._ms)
        line = (f"dispatch ticks: {len(ms)} in {now - self._since:.1f} s, p50 {ms[len(ms) // 2]:.2f} ms, "
                f"p99 {ms[int(0.99 * (len(ms) - 1))]:.2f} ms, max {ms[-1]:.2f} ms; up to {self._queued} requests queued")
        log.info(line)
        self._ms, self._queued, self._since = [], 0, now
        return line
