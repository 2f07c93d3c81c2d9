"""Admission: the verdict on one submitted job, the same function wherever it runs.

Life of a submission here (``judge``, pure: time, the backlog, the fleet and the profiles are
passed in):
1. an id seen before (``known``) is not run again: its verdict is said again, with the original
   reason; the same submission read again (a restart before its offset was committed) queues
   its requests again, in case their stream was cut short (the ones already read are known by
   id and dropped there). A REJECTED id is judged again (its earlier rejection stays in the
   job's event history) and counts as the id's next submission;
2. intake errors, a sampling mode the backend lacks, and everything ``policy.admit`` checks (ids,
   quotas, context, capacity, deadline feasibility against the admitted backlog) can reject it,
   with a reason a user can act on;
3. an admitted job's requests become ``QueueRequest`` decisions (for ``requests.pending``) and a
   ``JobChanged`` says ADMITTED.
The verdict's ``job`` is what the job's tracker (``tracker.JobTracker``) and the dispatcher's
backlog (``jobs.JobBacklog``) take: the control core calls ``judge`` with its own backlog and
takes the job at once (the simulator, one process, hands the verdict to its tracker); the live
admission desks (``streams/admission_desk.py``, partitioned by job across control-plane
instances) call it with the dispatcher's published load snapshot (its backlog and its fleet
rate per model) and send the job on ``jobs.admissions``, where both read it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from phaseroute.schemas.enums import JobEventKind, JobState
from phaseroute.schemas.ids import job_id_problem
from phaseroute.streams.policy import (
    Admitted,
    BacklogJob,
    FleetRate,
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

FINAL_KIND = {JobState.COMPLETED: JobEventKind.COMPLETED, JobState.FAILED: JobEventKind.FAILED,
              JobState.CANCELLED: JobEventKind.CANCELLED, JobState.EXPIRED: JobEventKind.EXPIRED,
              JobState.REJECTED: JobEventKind.REJECTED, JobState.ADMITTED: JobEventKind.ADMITTED,
              JobState.RUNNING: JobEventKind.RUNNING, JobState.SUBMITTED: JobEventKind.SUBMITTED}


@dataclass(frozen=True, slots=True)
class Verdict:
    """``job``: the judged job; ``decisions``: the requests to queue, then the job's event;
    ``fresh``: judged now (ADMITTED or REJECTED), for the tracker to take. Not fresh: the id was
    judged before and ``job`` is that earlier job, said again."""

    job: JobRecord
    decisions: list[Decision]
    fresh: bool = True


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


def judge(ev: JobSubmitted, known: JobRecord | None, backlog: Sequence[BacklogJob], pools: Sequence[PoolState],
          table: ProfileTable, quotas: Mapping[str, TenantQuota], config: CoreConfig, now: float,
          published_rates: Mapping[str, FleetRate] | None = None) -> Verdict:
    """The verdict on ``ev`` (see the module docstring). ``published_rates``: the fleet's rate per
    model from the dispatcher's load snapshot (a desk); None: from ``pools`` and ``table``."""
    if known is not None and known.state is not JobState.REJECTED:
        note = f"job id already submitted; not run again (it was {known.state.name}"
        note += f": {known.reason})" if known.reason else ")"
        return Verdict(known, _requeue_replay(known, ev) + [changed(known, FINAL_KIND[known.state], note)], False)
    job = JobRecord(ev.job_id, ev.tenant, ev.model, ev.priority, ev.submitted_at, ev.deadline, ev.quality_tier,
                    submissions=known.submissions + 1 if known else 1)
    problem = job_id_problem(ev.job_id) or ev.intake_error
    if problem is None and config.greedy_only and ev.temperature > 0:
        problem = (f"sampling.temperature={ev.temperature}: this deployment decodes greedily only;"
                   " submit with temperature 0")
    if problem is not None:
        return _reject(job, problem, None, now)
    verdict = admit(job_spec(ev), backlog, table, pools, config.models, quotas, config.admission, now, published_rates)
    if isinstance(verdict, Rejected):
        return _reject(job, verdict.reason, verdict.earliest_feasible_deadline, now,
                       verdict.code is RejectCode.DEADLINE_INFEASIBLE)
    return _admit(job, ev, verdict)


def _admit(job: JobRecord, ev: JobSubmitted, verdict: Admitted) -> Verdict:
    job.state = JobState.ADMITTED
    job.requests_total = len(verdict.requests)
    job.prefill_left = sum(w.prompt_tokens for w in verdict.requests)
    job.decode_left = sum(w.max_output_tokens for w in verdict.requests)
    job.estimated_completion = verdict.estimated_completion
    job.reason = f"estimated completion {format_time(verdict.estimated_completion)}"
    return Verdict(job, _queue_requests(job, ev, verdict.requests) + [changed(job, JobEventKind.ADMITTED, job.reason)])


def _requeue_replay(job: JobRecord, ev: JobSubmitted) -> list[Decision]:
    """The same submission read again: the stream of its requests to ``requests.pending`` may
    have been cut short, so every request is queued again. A new submission under a used id
    (another ``submitted_at``) queues nothing."""
    if (ev.submitted_at != job.submitted_at or len(ev.prompts) != job.requests_total or output_whole(job)
            or ev.intake_error is not None):
        return []
    return _queue_requests(job, ev, split_job(job_spec(ev)))


def _queue_requests(job: JobRecord, ev: JobSubmitted, requests: Sequence[RequestWork]) -> list[Decision]:
    return [QueueRequest(RequestQueued(
        work.request_id, job.job_id, job.tenant, prompt.custom_id, job.model, work.prompt_tokens,
        work.max_output_tokens, job.deadline, job.priority, job.quality_tier, ev.quality_tolerance), index)
        for index, (work, prompt) in enumerate(zip(requests, ev.prompts, strict=True))]


def _reject(job: JobRecord, reason: str, earliest: float | None, now: float, suggest_deadline: bool = False) -> Verdict:
    if earliest is not None and suggest_deadline:
        reason += f" (resubmit with a deadline at or after {format_time(earliest)}, {earliest - now:.0f} s from now)"
    job.state = JobState.REJECTED
    job.finished_at = now
    job.reason = reason
    return Verdict(job, [changed(job, JobEventKind.REJECTED, reason, earliest)])
