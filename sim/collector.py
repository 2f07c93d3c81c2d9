"""The garbage collector's pace while a simulation runs.

CPython's cyclic collector runs its youngest generation every 700 net allocations and a full
collection whenever the long-lived objects have grown by a quarter. A simulation allocates
millions of small objects that stay alive and hold no garbage cycles (the control core's
request states and attempts, one ``PoolState`` per dispatch, the router's per-tick views), so
at that pace the collector mostly re-walks objects it cannot free: on the 1M-request
benchmark its full collections freed nothing, and a run at the default pace took 296 s
against 261 s paced, side by side. ``paced_for_long_runs`` raises the youngest generation's threshold
for the run (cycles are still collected, in fewer, larger steps) and puts the previous
thresholds back afterwards. Results do not depend on it: the collector frees no live object.

The live control plane keeps the default pace: paced the same way, it was no faster on
``phaseroute bench control`` (one 50,000-request job on a FAKE fleet: 245.7 requests/s end to
end against 263.0 at the default pace), where Kafka, Faust and the Avro edge take its time.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 50_000  # net allocations between young collections (CPython's default: 700)


@contextmanager
def paced_for_long_runs(young: int = YOUNG_THRESHOLD) -> Iterator[None]:
    """Collect the youngest generation every ``young`` net allocations inside the block."""
    if young <= 0:
        raise ValueError(f"paced_for_long_runs: young threshold must be > 0, got {young}")
    before = gc.get_threshold()
    gc.set_threshold(young, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
