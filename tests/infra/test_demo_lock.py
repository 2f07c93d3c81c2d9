"""One demo per home at a time: a second demo started while the first runs would stop the
first's stack (and the first's clean-up the second's). The lock dies with its process, also
on kill -9, so a killed run never blocks the next."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phaseroute.demo import isolation

HOLD = """
import sys, time
from pathlib import Path
from phaseroute.demo import isolation
isolation.hold_demo_lock(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_demo_in_the_same_home_is_refused_until_the_first_dies(tmp_path: Path) -> None:
    first = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "held"
        with pytest.raises(isolation.DemoBusy, match=rf"another demo is running in {tmp_path} \(pid {first.pid}\)"):
            isolation.hold_demo_lock(tmp_path)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    deadline = time.monotonic() + 10
    while True:  # the kernel dropped the killed holder's lock: this process takes it
        try:
            isolation.hold_demo_lock(tmp_path)
            break
        except isolation.DemoBusy:
            assert time.monotonic() < deadline, "the lock of a killed demo was not released"
            time.sleep(0.1)
    assert (tmp_path / "demo.lock").read_text().strip() == str(os.getpid())
    isolation._held.pop().close()
