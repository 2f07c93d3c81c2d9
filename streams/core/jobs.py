"""Tracking of jobs: the job-keyed half of the control core.

Life of a job here (its verdict comes from ``admission.judge``):
1. ``take``: a judged job is tracked; an ADMITTED one joins the admission backlog (what
   admission judges the next job against) and, with a deadline, the expiry heap.
2. ``on_result``: the first result of each request counts (done or failed, tokens); the job is
   RUNNING from its first result and reports PROGRESS every ``progress_every`` results.
3. ``on_output_written``: the result sink's receipt. A job becomes COMPLETED (or FAILED, when no
   request succeeded) only when every request has a result AND a durable line: a finished job's
   output is whole when its final event is read.
4. ``cancel`` / ``expire``: CANCELLED / EXPIRED at once; the core fails its open requests
   (``batch_cancelled`` / ``batch_expired``) and the job's counters go on until its output is
   whole, when a last event with the same state says so.
``output_whole`` jobs are done with: the core forgets their requests (bounded state).
"""

from __future__ import annotations

import heapq

from phaseroute.schemas.enums import JobEventKind, JobState
from phaseroute.streams.policy import BacklogJob

from .admission import FINAL_KIND, changed, output_whole
from .config import CoreConfig
from .decisions import Decision
from .state import JobRecord

__all__ = ["JobBook", "changed", "output_whole"]


class JobBook:
    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self.jobs: dict[str, JobRecord] = {}
        self.open: dict[str, JobRecord] = {}  # admitted, requests still open: the admission backlog
        self._expiry: list[tuple[float, str]] = []  # (deadline + grace, job id) of open jobs
        self.dirty: set[str] = set()  # jobs whose persisted record changed

    # -- admission's verdicts -------------------------------------------------------------------
    def take(self, job: JobRecord) -> None:
        """Track a judged job (``admission.judge``'s verdict): an ADMITTED one joins the backlog
        and, with a deadline, the expiry heap; a REJECTED one is kept for its id's history."""
        self.jobs[job.job_id] = job
        self.dirty.add(job.job_id)
        if job.state is JobState.ADMITTED:
            self.open[job.job_id] = job
            if job.deadline is not None and self.config.expire_after_deadline_s is not None:
                heapq.heappush(self._expiry, (job.deadline + self.config.expire_after_deadline_s, job.job_id))

    def backlog(self) -> list[BacklogJob]:
        return [BacklogJob(j.job_id, j.tenant, j.model, j.deadline, j.prefill_left, j.decode_left)
                for j in self.open.values()]

    # -- tracking ------------------------------------------------------------------------------
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

    def on_result(self, job_id: str, ok: bool, tokens_in: int, tokens_out: int, now: float) -> list[Decision]:
        job = self.jobs.get(job_id)
        if job is None or job.state in (JobState.REJECTED, JobState.SUBMITTED):
            return []
        if ok:
            job.done += 1
        else:
            job.failed += 1
        job.tokens_in += tokens_in
        job.tokens_out += tokens_out
        self.dirty.add(job_id)
        out: list[Decision] = []
        if job.state is JobState.ADMITTED:
            job.state = JobState.RUNNING
            out.append(changed(job, JobEventKind.RUNNING))
        finished = job.finished_requests
        if finished >= job.requests_total:
            out += self._finish_if_whole(job, now)
        elif finished % self.config.progress_every == 0:
            out.append(changed(job, JobEventKind.PROGRESS, seq=finished))
        return out

    def on_output_written(self, job_id: str, lines: int, now: float) -> list[Decision]:
        job = self.jobs.get(job_id)
        if job is None or lines <= job.lines_written or job.state in (JobState.REJECTED, JobState.SUBMITTED):
            return []  # a replayed receipt only repeats a count
        job.lines_written = lines
        self.dirty.add(job_id)
        return self._finish_if_whole(job, now)

    def _finish_if_whole(self, job: JobRecord, now: float) -> list[Decision]:
        if not output_whole(job):
            return []
        if job.state in (JobState.CANCELLED, JobState.EXPIRED):
            return [changed(job, FINAL_KIND[job.state], "output whole", seq=job.submissions)]
        if job.state.is_finished:
            return []
        job.state = JobState.COMPLETED if job.done else JobState.FAILED
        job.finished_at = now
        self.open.pop(job.job_id, None)
        return [changed(job, FINAL_KIND[job.state])]

    def cancel(self, job_id: str, tenant: str, reason: str, now: float) -> JobRecord | None:
        """CANCELLED at once, when ``tenant`` owns the job and it is not finished; else None."""
        job = self.jobs.get(job_id)
        if job is None or job.tenant != tenant or job.state.is_finished:
            return None
        return self._end(job, JobState.CANCELLED, reason, now)

    def due_expiry(self, now: float) -> list[JobRecord]:
        """Open jobs whose deadline passed more than the grace ago: EXPIRED now."""
        out = []
        while self._expiry and self._expiry[0][0] <= now:
            _, job_id = heapq.heappop(self._expiry)
            job = self.jobs.get(job_id)
            if job is not None and not job.state.is_finished:
                grace = self.config.expire_after_deadline_s or 0.0
                out.append(self._end(job, JobState.EXPIRED, f"not finished {grace:.0f} s after its deadline", now))
        return out

    def _end(self, job: JobRecord, state: JobState, reason: str, now: float) -> JobRecord:
        job.state = state
        job.finished_at = now
        job.reason = reason
        self.open.pop(job.job_id, None)
        self.dirty.add(job.job_id)
        return job

    # -- restart -------------------------------------------------------------------------------
    def restore(self, job: JobRecord) -> None:
        self.jobs[job.job_id] = job
        if job.state in (JobState.ADMITTED, JobState.RUNNING) and (job.prefill_left > 0 or job.decode_left > 0):
            self.open[job.job_id] = job
        if (job.deadline is not None and self.config.expire_after_deadline_s is not None
                and not job.state.is_finished):
            heapq.heappush(self._expiry, (job.deadline + self.config.expire_after_deadline_s, job.job_id))
