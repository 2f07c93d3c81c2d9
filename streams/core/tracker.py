"""Tracking of jobs: the job-keyed half of the control plane, run partitioned by job id.

Every control-plane instance runs a ``JobTracker`` for the jobs of the partitions it owns
(``streams/tracking_loop.py``); the simulator runs one beside its one dispatcher. Pure: events
in, decisions out, ``now`` passed in. Life of a job here:
1. ``JobAdmitted``: an admission desk's verdict is taken (a replay of one taken already, same
   or older submission, changes nothing); an ADMITTED job with a deadline joins the expiry heap.
2. ``OutputWritten``: the result sink's receipt carries the exact tallies of the job's durable
   output (lines, success and error lines, tokens), so the job's counters are the output's own:
   a result read twice, a speculative copy or a replayed receipt never counts twice. The first
   receipt makes the job RUNNING, every ``progress_every`` lines report PROGRESS, and once every
   request has its line the job is COMPLETED (FAILED when no request succeeded).
3. ``CancelRequested`` by the tenant that owns the job: CANCELLED at once; ``tick``: EXPIRED
   once its deadline passed more than the grace ago. The job's event says so on ``jobs.state``,
   where the dispatcher reads it (``JobEnded``) and fails the job's open requests; their error
   lines then make the output whole, and a last event with the same state says so.
A finished job whose output is whole (and a rejected one) is dropped ``finished_job_ttl_s``
after it finished, its record tombstoned: the tracker's state grows with recent jobs, not with
history. A receipt or a cancel read before its job's verdict (another topic, read apart) waits
for it, up to ``early_event_ttl_s``. An exception while handling one event becomes a ``Problem`` and
the tracker goes on. ``changed_records`` gives the records to persist (the instance writes them
to its changelog before it commits the events it read); ``restore`` takes them back.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any

from phaseroute.schemas.enums import JobEventKind, JobState

from .admission import FINAL_KIND, changed, output_whole
from .config import CoreConfig
from .decisions import Decision, Problem
from .events import CancelRequested, JobAdmitted, OutputWritten
from .state import JobRecord

TrackerEvent = JobAdmitted | OutputWritten | CancelRequested


class JobTracker:
    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self.jobs: dict[str, JobRecord] = {}
        self.dirty: set[str] = set()  # jobs whose persisted record changed
        self._expiry: list[tuple[float, str]] = []  # (deadline + grace, job id) of unfinished jobs
        self._retire: list[tuple[float, str]] = []  # (finished + ttl, job id) of jobs done with
        self._dropped: set[str] = set()  # jobs dropped since the last ``changed_records``: tombstones
        self._early: dict[str, list[tuple[float, OutputWritten | CancelRequested]]] = {}
        self._handlers: dict[type, Callable[[Any, float], list[Decision]]] = {
            JobAdmitted: self._admitted, OutputWritten: self._written, CancelRequested: self._cancel}

    # -- the two entry points ------------------------------------------------------------------
    def handle(self, event: TrackerEvent, now: float) -> list[Decision]:
        try:
            return self._handlers[type(event)](event, now)
        except Exception as exc:  # one bad event must not stop the tracker
            return [Problem(type(event).__name__, f"{type(exc).__name__}: {exc}", event)]

    def tick(self, now: float) -> list[Decision]:
        """Expiries; early events whose job never came, and jobs done with long enough, dropped."""
        cutoff = now - self.config.early_event_ttl_s
        for job_id in [j for j, events in self._early.items() if events[0][0] < cutoff]:
            del self._early[job_id]
        while self._retire and self._retire[0][0] <= now:
            _, job_id = heapq.heappop(self._retire)
            job = self.jobs.get(job_id)
            if job is not None and self._done_with(job):
                del self.jobs[job_id]
                self.dirty.discard(job_id)
                self._dropped.add(job_id)
        out: list[Decision] = []
        grace = self.config.expire_after_deadline_s or 0.0
        while self._expiry and self._expiry[0][0] <= now:
            _, job_id = heapq.heappop(self._expiry)
            job = self.jobs.get(job_id)
            if job is not None and not job.state.is_finished:
                self._end(job, JobState.EXPIRED, f"not finished {grace:.0f} s after its deadline", now)
                out.append(changed(job, JobEventKind.EXPIRED, job.reason))
        return out

    # -- events --------------------------------------------------------------------------------
    def _admitted(self, ev: JobAdmitted, now: float) -> list[Decision]:
        job = ev.job
        known = self.jobs.get(job.job_id)
        if known is not None and known.submissions >= job.submissions:
            return []
        self._take(job)
        if job.state is not JobState.ADMITTED:
            return []
        out: list[Decision] = []
        for _, early in self._early.pop(job.job_id, []):
            out += self._handlers[type(early)](early, now)
        return out

    def _take(self, job: JobRecord) -> None:
        self.jobs[job.job_id] = job
        self.dirty.add(job.job_id)
        self._dropped.discard(job.job_id)
        if (job.state in (JobState.ADMITTED, JobState.RUNNING) and job.deadline is not None
                and self.config.expire_after_deadline_s is not None):
            heapq.heappush(self._expiry, (job.deadline + self.config.expire_after_deadline_s, job.job_id))
        self._retire_later(job)

    @staticmethod
    def _done_with(job: JobRecord) -> bool:
        return job.state is JobState.REJECTED or (job.state.is_finished and output_whole(job))

    def _retire_later(self, job: JobRecord) -> None:
        if self._done_with(job):
            heapq.heappush(self._retire, ((job.finished_at or 0.0) + self.config.finished_job_ttl_s, job.job_id))

    def _waits(self, job_id: str, event: OutputWritten | CancelRequested, now: float) -> bool:
        """True when ``job_id`` has no verdict here yet: the event waits for it."""
        if job_id in self.jobs:
            return False
        self._early.setdefault(job_id, []).append((now, event))
        return True

    def _written(self, ev: OutputWritten, now: float) -> list[Decision]:
        if self._waits(ev.job_id, ev, now):
            return []
        job = self.jobs[ev.job_id]
        if ev.lines <= job.lines_written or job.state in (JobState.REJECTED, JobState.SUBMITTED):
            return []  # a replayed receipt only repeats a count
        before = job.lines_written
        job.lines_written, job.done, job.failed = ev.lines, ev.ok, ev.failed
        job.tokens_in, job.tokens_out = ev.tokens_in, ev.tokens_out
        self.dirty.add(job.job_id)
        out: list[Decision] = []
        if job.state is JobState.ADMITTED:
            job.state = JobState.RUNNING
            out.append(changed(job, JobEventKind.RUNNING))
        every = self.config.progress_every
        if output_whole(job):
            out += self._finish(job, now)
        elif ev.lines // every > before // every:
            out.append(changed(job, JobEventKind.PROGRESS, seq=ev.lines // every * every))
        return out

    def _finish(self, job: JobRecord, now: float) -> list[Decision]:
        """The job's output is whole: its final state (or, for a cancelled or expired one, a last
        event saying so); it is done with from now."""
        if job.state in (JobState.CANCELLED, JobState.EXPIRED):
            self._retire_later(job)
            return [changed(job, FINAL_KIND[job.state], "output whole", seq=job.submissions)]
        if job.state.is_finished:
            return []
        job.state = JobState.COMPLETED if job.done else JobState.FAILED
        job.finished_at = now
        self._retire_later(job)
        return [changed(job, FINAL_KIND[job.state])]

    def _cancel(self, ev: CancelRequested, now: float) -> list[Decision]:
        """CANCELLED at once when ``ev.tenant`` owns the job and it is not finished. A drift
        canary's round is no job: the dispatcher withdraws those itself."""
        if ev.tenant == self.config.canary_tenant or self._waits(ev.job_id, ev, now):
            return []
        job = self.jobs[ev.job_id]
        if job.tenant != ev.tenant or job.state.is_finished:
            return []  # another tenant's, or already finished: nothing changes
        self._end(job, JobState.CANCELLED, ev.reason, now)
        return [changed(job, JobEventKind.CANCELLED, ev.reason)]

    def _end(self, job: JobRecord, state: JobState, reason: str, now: float) -> None:
        job.state, job.finished_at, job.reason = state, now, reason
        self.dirty.add(job.job_id)

    # -- persistence and partitions ------------------------------------------------------------
    def changed_records(self) -> dict[str, dict[str, Any] | None]:
        """The records of the jobs changed since the last call (job id -> record; None: the job
        was dropped, a tombstone), to persist."""
        out: dict[str, dict[str, Any] | None] = {job_id: None for job_id in self._dropped}
        out.update({job_id: self.jobs[job_id].to_record() for job_id in self.dirty if job_id in self.jobs})
        self.dirty.clear()
        self._dropped.clear()
        return out

    def restore(self, record: dict[str, Any]) -> None:
        """Take one persisted job record back (an instance given the job's partition)."""
        job = JobRecord.from_record(record)
        self._take(job)
        self.dirty.discard(job.job_id)

    def release(self, job_ids: Iterable[str]) -> None:
        """Stop tracking these jobs (their partition went to another instance)."""
        for job_id in job_ids:
            self.jobs.pop(job_id, None)
            self._early.pop(job_id, None)
            self.dirty.discard(job_id)
