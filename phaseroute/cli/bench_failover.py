"""``phaseroute bench control --kill-after S``: the dispatcher killed (SIGKILL) mid-bench.

``S`` seconds after the first submission the bench kills ``control-0`` (the instance that holds
the control lease and dispatches) and watches the others' logs: when one of them takes the lease
and when it has restored the core from the changelog tables (how many requests and jobs it read
back). The jobs must still complete with every request once; the bench's other figures then
include the fail-over.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Any

from phaseroute.streams.shell import RESTORED

TAKEN = "holds the control lease after"
RESTORED_LINE = re.compile(re.escape(RESTORED) + r": (\d+) requests, (\d+) jobs")


class FailoverProbe:
    def __init__(self, work: Path, instances: int, kill_after_s: float) -> None:
        if instances < 2:
            raise RuntimeError("--kill-after needs a standby to take over: run it with --control 2 or more")
        self.work, self.instances, self.kill_after_s = work, instances, kill_after_s
        self.killed_at: float | None = None
        self.taken_at: float | None = None
        self.restored_at: float | None = None
        self.restored: tuple[int, int] | None = None
        self.by: str | None = None

    def step(self, started: float, procs: dict[str, subprocess.Popen[bytes]]) -> None:
        """Kill the dispatcher when it is time; note what the standbys log after."""
        now = time.time()
        if self.killed_at is None:
            if now - started >= self.kill_after_s:
                victim = procs.pop("control-0")
                victim.kill()
                victim.wait(30)
                self.killed_at = time.time()
            return
        for i in range(1, self.instances):
            text = (self.work / f"control-{i}.log").read_text(errors="replace")
            if self.taken_at is None and TAKEN in text:
                self.taken_at, self.by = now, f"control-{i}"
            match = RESTORED_LINE.search(text)
            if self.restored_at is None and match:
                self.restored_at, self.restored = now, (int(match.group(1)), int(match.group(2)))

    def report(self, started: float) -> dict[str, Any]:
        if self.killed_at is None:
            return {"killed": False}

        def since_kill(t: float | None) -> float | None:
            return None if t is None or self.killed_at is None else round(t - self.killed_at, 1)

        return {
            "killed": "control-0", "killed_s_after_first_submit": round(self.killed_at - started, 1),
            "lease_taken_by": self.by, "lease_taken_s_after_kill": since_kill(self.taken_at),
            "restored_s_after_kill": since_kill(self.restored_at),
            "requests_restored": self.restored[0] if self.restored else None,
            "jobs_restored": self.restored[1] if self.restored else None,
            "note": "times are as this bench saw the log lines (polled about every second)",
        }
