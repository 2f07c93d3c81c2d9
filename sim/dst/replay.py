"""Replay a deterministic simulation's event log into a fresh core and tracker, and shrink a failing log to
the shortest one that still breaks the same invariant (delta debugging over log entries).

The log holds every input the core got (events, ticks as ``None``, restarts with what the crash
lost and the new core's seed), so a replay needs no fleet: the same inputs give the same
decisions. Shrinking applies to safety invariants (checked after every event); a liveness
violation found at the end of a run is reported with its seed and log length instead.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from phaseroute.sim.dst import invariants
from phaseroute.sim.dst.control import DstControl
from phaseroute.sim.dst.harness import Flushed, LogEntry, Restart, Restored
from phaseroute.sim.dst.invariants import Ledger, Violation
from phaseroute.sim.dst.store import JournalStore
from phaseroute.streams.core import CoreConfig, ResultReceived


def replay(log: Sequence[LogEntry], config: CoreConfig, seed: int, write_behind: bool = False) -> Violation | None:
    """Feed ``log`` to a new core (writing its store as the run's did); the first safety violation, or None."""
    store = JournalStore()
    sut = DstControl(config, store, seed=seed, write_behind=write_behind)
    ledger = Ledger()
    try:
        for now, entry in log:
            core = sut.core
            if isinstance(entry, Restart):
                if entry.lost == "writes":
                    store.rollback()
                store = store.reloaded()
                sut = DstControl(config, store, seed=entry.seed, write_behind=write_behind)
                ledger.epoch += 1
                continue
            if isinstance(entry, Restored):
                invariants.after_event(core, core.restore(now), ledger, now)
                continue
            store.mark()
            if isinstance(entry, Flushed):
                sut.flush()
                continue
            before = core.dispatch.fair.report()
            decisions, _ = sut.call(entry, now)
            if isinstance(entry, ResultReceived) and entry.request_id not in ledger.ended:
                ledger.ended[entry.request_id] = ledger.epoch
            invariants.after_event(core, decisions, ledger, now)
            if entry is None:
                invariants.fair_share(core, before)
    except Violation as violation:
        return violation
    return None


def shrink(log: list[LogEntry], config: CoreConfig, seed: int, invariant: str,
           budget_s: float = 120.0, write_behind: bool = False) -> list[LogEntry]:
    """The shortest sub-log found within ``budget_s`` whose replay still breaks ``invariant`` (ddmin)."""
    def fails(candidate: list[LogEntry]) -> bool:
        found = replay(candidate, config, seed, write_behind)
        return found is not None and found.invariant == invariant

    deadline = time.monotonic() + budget_s
    current, chunks = list(log), 2
    while len(current) >= 2 and time.monotonic() < deadline:
        size = max(1, len(current) // chunks)
        for start in range(0, len(current), size):
            candidate = current[:start] + current[start + size:]
            if candidate and fails(candidate):
                current, chunks = candidate, max(chunks - 1, 2)
                break
            if time.monotonic() >= deadline:
                break
        else:
            if size == 1:
                break
            chunks = min(len(current), chunks * 2)
    return current
