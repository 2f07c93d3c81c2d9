"""The dispatcher's view of jobs: the admission backlog, and which jobs ended.

The jobs themselves are tracked elsewhere, partitioned by job id (``tracker.JobTracker``); the
dispatcher keeps of each job only what its own decisions need:
1. ``take``: an admission verdict; an ADMITTED job joins the admission backlog (the prompt and
   output tokens of its requests not yet closed: what the load snapshot tells the desks).
2. ``on_request_closed``: one of its requests has its final result, or is failing: its tokens
   leave the backlog.
3. ``end``: the tracker's final state of the job (``JobEnded``): it leaves the backlog; a
   request of it that arrives later ends at once; once its output is whole its requests are
   forgotten.
4. ``retire``: a job done with (its output whole, or rejected) whose requests are all forgotten
   is dropped ``finished_job_ttl_s`` after it finished, its stored record tombstoned (``dropped``),
   as the tracker drops its own: the dispatcher's jobs grow with recent jobs, not with history.
   Until then a replayed request of it finds the job whole and changes nothing; the dispatcher
   commits what it read within seconds, so only a replay from a reset consumer group could read
   a request that old again.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from phaseroute.schemas.enums import JobState
from phaseroute.streams.policy import BacklogJob

from .admission import changed, output_whole
from .config import CoreConfig
from .events import JobEnded
from .state import JobRecord

__all__ = ["JobBacklog", "changed", "output_whole"]


class JobBacklog:
    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self.jobs: dict[str, JobRecord] = {}
        self.open: dict[str, JobRecord] = {}  # admitted, requests still open: the admission backlog
        self.dirty: set[str] = set()  # jobs whose persisted record changed
        self.dropped: set[str] = set()  # jobs dropped since the last write of the store: tombstones
        self._retire: list[tuple[float, str]] = []  # (finished + ttl, job id) of jobs done with

    def take(self, job: JobRecord, now: float) -> bool:
        """Take a verdict; False for a replay of one taken already (same or older submission)."""
        known = self.jobs.get(job.job_id)
        if known is not None and known.submissions >= job.submissions:
            return False
        self.jobs[job.job_id] = job
        self.dirty.add(job.job_id)
        self.dropped.discard(job.job_id)
        if job.state is JobState.ADMITTED:
            self.open[job.job_id] = job
        elif job.state is JobState.REJECTED:
            self._retire_later(job, now)
        return True

    def backlog(self) -> list[BacklogJob]:
        return [BacklogJob(j.job_id, j.tenant, j.model, j.deadline, j.prefill_left, j.decode_left)
                for j in self.open.values()]

    def on_request_closed(self, job_id: str, prompt_tokens: int, max_tokens: int) -> None:
        """One of the job's requests will not run any more (it has its final result, or it is failing)."""
        job = self.open.get(job_id)
        if job is None:
            return
        job.prefill_left -= prompt_tokens
        job.decode_left -= max_tokens
        self.dirty.add(job_id)
        if job.prefill_left <= 0 and job.decode_left <= 0:
            del self.open[job_id]

    def end(self, ev: JobEnded, now: float) -> JobRecord | None:
        """The tracker's final state of the job; None when its verdict was not read here."""
        job = self.jobs.get(ev.job_id)
        if job is None:
            return None
        whole_before = self._done_with(job)
        job.state, job.reason = ev.state, ev.reason
        job.done, job.failed, job.lines_written = ev.done, ev.failed, ev.lines_written
        if job.finished_at is None:
            job.finished_at = now
        self.open.pop(ev.job_id, None)
        self.dirty.add(ev.job_id)
        if not whole_before:
            self._retire_later(job, now)
        return job

    def retire(self, now: float, still_held: Callable[[str], bool]) -> None:
        """Drop the jobs done with for ``finished_job_ttl_s``; one whose requests are not all
        forgotten yet (``still_held``) is looked at again a ttl later."""
        while self._retire and self._retire[0][0] <= now:
            _, job_id = heapq.heappop(self._retire)
            job = self.jobs.get(job_id)
            if job is None or not self._done_with(job):
                continue
            if still_held(job_id):
                heapq.heappush(self._retire, (now + self.config.finished_job_ttl_s, job_id))
                continue
            del self.jobs[job_id]
            self.open.pop(job_id, None)
            self.dirty.discard(job_id)
            self.dropped.add(job_id)

    @staticmethod
    def _done_with(job: JobRecord) -> bool:
        return job.state is JobState.REJECTED or (job.state.is_finished and output_whole(job))

    def _retire_later(self, job: JobRecord, now: float) -> None:
        if self._done_with(job):
            finished = job.finished_at if job.finished_at is not None else now
            heapq.heappush(self._retire, (finished + self.config.finished_job_ttl_s, job.job_id))

    def is_whole(self, job_id: str) -> bool:
        """The job ended and its output holds a line for every request."""
        job = self.jobs.get(job_id)
        return job is not None and job.state.is_finished and output_whole(job)

    def restore(self, job: JobRecord, now: float) -> None:
        self.jobs[job.job_id] = job
        if job.state in (JobState.ADMITTED, JobState.RUNNING) and (job.prefill_left > 0 or job.decode_left > 0):
            self.open[job.job_id] = job
        self._retire_later(job, now)
