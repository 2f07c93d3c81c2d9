"""The control plane as a deterministic simulation runs it: the shipped dispatching core and job
tracker in one process (``OneProcessControl``), both persisted to one ``JournalStore``.

The core writes its three tables as it always does (every call, or at ``flush`` when it writes
behind); the tracker's changed job records go to the store's ``tracked`` table at the same
moments, so a crash that loses the last writes loses both halves' (live, the tracker writes its
changelog before it commits the events it read, as the core does). A restarted control plane is
a new ``DstControl`` over the reloaded store: the tracker takes its records back at once, the core
when the harness calls ``restore``.
"""

from __future__ import annotations

from phaseroute.sim.dst.store import JournalStore
from phaseroute.streams.core import ControlCore, CoreConfig, Decision, JobTracker
from phaseroute.streams.core.events import Event
from phaseroute.streams.core.one_process import OneProcessControl


class DstControl:
    def __init__(self, config: CoreConfig, store: JournalStore, seed: int, write_behind: bool) -> None:
        self.store, self.write_behind = store, write_behind
        self.core = ControlCore(config, store, seed=seed, write_behind=write_behind)
        self.tracker = JobTracker(config)
        for record in store.tracked.values():
            self.tracker.restore(record)
        self.control = OneProcessControl(self.core, self.tracker, keep_hops=True)

    def call(self, entry: Event | None, now: float) -> tuple[list[Decision], list[Event]]:
        """One event (None: a tick) through both halves: the decisions, and the events carried
        between the halves (live they are Kafka records, read again after a crash like any other)."""
        out = self.control.tick(now) if entry is None else self.control.handle(entry, now)
        if not self.write_behind:
            self._write_tracker()
        hops, self.control.hops = self.control.hops, []
        return out, hops

    def flush(self) -> None:
        self.core.flush()
        self._write_tracker()

    def _write_tracker(self) -> None:
        for job_id, record in self.tracker.changed_records().items():
            if record is None:
                self.store.tracked.pop(job_id, None)
            else:
                self.store.tracked[job_id] = record
