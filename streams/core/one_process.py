"""The control plane in one process, without Kafka: the dispatching core and the job tracker,
with the hops the live pipeline makes between them over Kafka made by direct calls.

Live, the two halves run apart (the tracker partitioned by job id in every instance, the core
in the one active dispatcher) and meet only through topics; the simulator, the deterministic
simulation tests and the unit tests drive both here, through the same hops:
- a verdict (``JobChanged`` ADMITTED or REJECTED, from the core's admission, or a
  ``JobAdmitted`` a test hands in) -> the tracker takes it (live: ``jobs.admissions``);
- a job's final state from the tracker -> ``JobEnded`` to the core, converted by the same
  function the live dispatcher uses on ``jobs.state`` (``edge.job_ended``);
- a cancel -> the tracker (a tenant's job) and the core (a canary round's withdrawal);
- the result sink's receipts (``OutputWritten``) come from the driver, which plays the sink.
"""

from __future__ import annotations

from phaseroute.schemas.enums import JobEventKind

from .core import ControlCore
from .decisions import Decision, JobChanged
from .events import CancelRequested, Event, JobAdmitted, OutputWritten
from .state import JobRecord
from .tracker import JobTracker

_VERDICTS = (JobEventKind.ADMITTED, JobEventKind.REJECTED)


class OneProcessControl:
    def __init__(self, core: ControlCore, tracker: JobTracker | None = None, keep_hops: bool = False) -> None:
        self.core = core
        self.tracker = tracker if tracker is not None else JobTracker(core.config)
        self.keep_hops = keep_hops  # a driver that redelivers them takes them from ``hops`` (and empties it)
        self.hops: list[Event] = []  # the events carried between the halves, in order, when kept

    def handle(self, event: Event, now: float) -> list[Decision]:
        if isinstance(event, OutputWritten):
            out = self.tracker.handle(event, now)
        elif isinstance(event, JobAdmitted):  # each half keeps its own record, as each decodes its own live
            out = self.tracker.handle(_copy(event), now) + self.core.handle(_copy(event), now)
        elif isinstance(event, CancelRequested):
            out = self.tracker.handle(event, now) + self.core.handle(event, now)
        else:
            out = self.core.handle(event, now)
        return self._hops(out, now)

    def tick(self, now: float) -> list[Decision]:
        return self._hops(self.tracker.tick(now) + self.core.tick(now), now)

    @property
    def more_to_release(self) -> bool:
        return self.core.more_to_release

    def _hops(self, decisions: list[Decision], now: float) -> list[Decision]:
        from phaseroute.streams.edge import job_ended, job_event  # the live dispatcher's conversion

        out = list(decisions)
        for d in decisions:
            if not isinstance(d, JobChanged):
                continue
            if d.kind in _VERDICTS:
                verdict = JobAdmitted(JobRecord.from_record(d.job), now)
                self._keep(verdict)
                out += self._hops(self.tracker.handle(verdict, now), now)
                continue
            ended = job_ended(job_event(d, now, None))
            if ended is not None:
                self._keep(ended)
                out += self._hops(self.core.handle(ended, now), now)
        return out

    def _keep(self, hop: Event) -> None:
        if self.keep_hops:
            self.hops.append(hop)


def _copy(ev: JobAdmitted) -> JobAdmitted:
    return JobAdmitted(JobRecord.from_record(ev.job.to_record()), ev.at)
