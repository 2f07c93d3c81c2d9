"""Admission and tracking of jobs: the job-keyed half of the control core.

Life of a job here:
1. ``submit``: an id seen before is not run twice (its state is said again, with the original
   reason; the same submission read again after a restart queues its requests again, in case
   their stream was cut short), except a REJECTED id, which is judged again (its earlier
   rejection stays in the job's event history). Intake errors, a sampling mode the backend lacks, and everything
   ``policy.admit`` checks (ids, quotas, context, capacity, deadline feasibility against the
   admitted backlog) can reject it, with a reason a user can act on; an admitted job's requests
   become ``QueueRequest`` decisions (for ``requests.pending``) and the job is ADMITTED.
2. ``on_result``: the first result of each request counts (done or failed, tokens); the job is
   RUNNING from its first result and reports PROGRESS every ``progress_every`` results.
3. ``on_output_written``: the result sink's receipt. A job becomes COMPLETED (or FAILED, when no
   request succeeded) only when every request has a result AND a durable line: a finished job's
   output is whole when its final event is read.
4. ``cancel`` / ``expire``: CANCELLED / EXPIRED at once; the core fails its open requests
   (``batch_cancelled`` / ``batch_expired``) and the job's counters go on until its output is
   whole, when a last event with the same state says so.
``output_whole`` jobs are done with: the core forgets their requests (bounded state).
Everything is keyed by job id, so this half can later be partitioned by job across instances.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from phaseroute.schemas.enums import JobEventKind, JobState
from phaseroute.schemas.ids import job_id_problem
from phaseroute.streams.policy import (
    Admitted,
    BacklogJob,
    JobSpec,
    PoolState,
    ProfileTable,
    RejectCode,
    Rejected,
    RequestWork,
    TenantQuota,
    admit,
    format_time,
    split_job,
)

from .config import CoreConfig
from .decisions import Decision, JobChanged, QueueRequest
from .events import JobSubmitted, RequestQueued
from .state import JobRecord

_FINAL_KIND = {JobState.COMPLETED: JobEventKind.COMPLETED, JobState.FAILED: JobEventKind.FAILED,
               JobState.CANCELLED: JobEventKind.CANCELLED, JobState.EXPIRED: JobEventKind.EXPIRED,
               JobState.REJECTED: JobEventKind.REJECTED, JobState.ADMITTED: JobEventKind.ADMITTED,
               JobState.RUNNING: JobEventKind.RUNNING, JobState.SUBMITTED: JobEventKind.SUBMITTED}


def changed(job: JobRecord, kind: JobEventKind, reason: str | None = None, earliest: float | None = None,
            seq: int | None = None) -> JobChanged:
    """A job event for ``job`` as it is now. State events of a job's n-th submission use seq n-1
    (a resubmitted id gets new event ids); PROGRESS uses the finished-request count."""
    return JobChanged(job.to_record(), kind, reason, earliest, job.submissions - 1 if seq is None else seq)


def job_spec(ev: JobSubmitted) -> JobSpec:
    """What admission judges of a submission (and ``split_job`` splits into requests)."""
    return JobSpec(
        job_id=ev.job_id, tenant=ev.tenant, model=ev.model, prompt_tokens=tuple(p.tokens for p in ev.prompts),
        max_output_tokens=max((p.max_tokens for p in ev.prompts), default=1), deadline=ev.deadline,
        quality_tier=ev.quality_tier, quality_tolerance=ev.quality_tolerance, priority=ev.priority,
        custom_ids=tuple(p.custom_id for p in ev.prompts), output_tokens=tuple(p.max_tokens for p in ev.prompts),
    )


def output_whole(job: JobRecord) -> bool:
    """Every request of an admitted job has a result and a durable line."""
    total = job.requests_total
    return job.finished_requests >= total and job.lines_written >= total


class JobBook:
    def __init__(self, config: CoreConfig) -> None:
        self.config = config
        self.jobs: dict[str, JobRecord] = {}
        self.open: dict[str, JobRecord] = {}  # admitted, requests still open: the admission backlog
        self._expiry: list[tuple[float, str]] = []  # (deadline + grace, job id) of open jobs
        self.dirty: set[str] = set()  # jobs whose persisted record changed

    # -- admission -----------------------------------------------------------------------------
    def submit(self, ev: JobSubmitted, now: float, pools: Sequence[PoolState], table: ProfileTable,
               quotas: Mapping[str, TenantQuota]) -> list[Decision]:
        known = self.jobs.get(ev.job_id)
        if known is not None and known.state is not JobState.REJECTED:
            note = f"job id already submitted; not run again (it was {known.state.name}"
            note += f": {known.reason})" if known.reason else ")"
            return self._requeue_replay(known, ev) + [changed(known, _FINAL_KIND[known.state], note)]
        job = JobRecord(ev.job_id, ev.tenant, ev.model, ev.priority, ev.submitted_at, ev.deadline, ev.quality_tier,
                        submissions=known.submissions + 1 if known else 1)
        problem = job_id_problem(ev.job_id) or ev.intake_error
        if problem is None and self.config.greedy_only and ev.temperature > 0:
            problem = (f"sampling.temperature={ev.temperature}: this deployment decodes greedily only;"
                       " submit with temperature 0")
        if problem is not None:
            return self._reject(job, problem, None, now)
        verdict = admit(job_spec(ev), self.backlog(), table, pools, self.config.models, quotas, self.config.admission, now)
        if isinstance(verdict, Rejected):
            return self._reject(job, verdict.reason, verdict.earliest_feasible_deadline, now,
                                verdict.code is RejectCode.DEADLINE_INFEASIBLE)
        return self._admit(job, ev, verdict, now)

    def _admit(self, job: JobRecord, ev: JobSubmitted, verdict: Admitted, now: float) -> list[Decision]:
        job.state = JobState.ADMITTED
        job.requests_total = len(verdict.requests)
        job.prefill_left = sum(w.prompt_tokens for w in verdict.requests)
        job.decode_left = sum(w.max_output_tokens for w in verdict.requests)
        job.estimated_completion = verdict.estimated_completion
        job.reason = f"estimated completion {format_time(verdict.estimated_completion)}"
        self.jobs[job.job_id] = job
        self.open[job.job_id] = job
        self.dirty.add(job.job_id)
        if job.deadline is not None and self.config.expire_after_deadline_s is not None:
            heapq.heappush(self._expiry, (job.deadline + self.config.expire_after_deadline_s, job.job_id))
        return self._queue_requests(job, ev, verdict.requests) + [changed(job, JobEventKind.ADMITTED, job.reason)]

    def _requeue_replay(self, job: JobRecord, ev: JobSubmitted) -> list[Decision]:
        """The same submission read again (a restart before its offset was committed): the stream
        of its requests to ``requests.pending`` may have been cut short, so every request is
        queued again; the ones already read are known by id and dropped there. A new submission
        under a used id (another ``submitted_at``) queues nothing."""
        if (ev.submitted_at != job.submitted_at or len(ev.prompts) != job.requests_total or output_whole(job)
                or ev.intake_error is not None):
            return []
        return self._queue_requests(job, ev, split_job(job_spec(ev)))

    def _queue_requests(self, job: JobRecord, ev: JobSubmitted, requests: Sequence[RequestWork]) -> list[Decision]:
        return [QueueRequest(RequestQueued(
            work.request_id, job.job_id, job.tenant, prompt.custom_id, job.model, work.prompt_tokens,
            work.max_output_tokens, job.deadline, job.priority, job.quality_tier, ev.quality_tolerance), index)
            for index, (work, prompt) in enumerate(zip(requests, ev.prompts, strict=True))]

    def _reject(self, job: JobRecord, reason: str, earliest: float | None, now: float,
                suggest_deadline: bool = False) -> list[Decision]:
        if earliest is not None and suggest_deadline:
            reason += f" (resubmit with a deadline at or after {format_time(earliest)}, {earliest - now:.0f} s from now)"
        job.state = JobState.REJECTED
        job.finished_at = now
        job.reason = reason
        self.jobs[job.job_id] = job
        self.dirty.add(job.job_id)
        return [changed(job, JobEventKind.REJECTED, reason, earliest)]

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
            return [changed(job, _FINAL_KIND[job.state], "output whole", seq=job.submissions)]
        if job.state.is_finished:
            return []
        job.state = JobState.COMPLETED if job.done else JobState.FAILED
        job.finished_at = now
        self.open.pop(job.job_id, None)
        return [changed(job, _FINAL_KIND[job.state])]

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
