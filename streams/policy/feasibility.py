"""Deadline feasibility of a new job against the admitted backlog (earliest deadline first).

The fleet is modelled as one server working at its measured throughput, in seconds of work.
Admitted jobs with a deadline run in deadline order; the new job slots in after every job
whose deadline is <= its own. It is feasible when it finishes by its deadline and every
admitted job after it that is on time now is still on time with the new job's work added
ahead of it. :func:`earliest_feasible_deadline` scans the insertion points for the smallest
deadline that would be accepted (optionally not before a given one). Jobs without a deadline
run after all others and constrain nothing (their work is not "ahead" of a job with one).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class QueuedWork:
    """Work (seconds at fleet throughput) of one admitted job, with its deadline."""

    job_id: str
    deadline: float
    work_s: float


@dataclass(frozen=True)
class Feasibility:
    feasible: bool
    completion: float  # when the new job would finish at its slot
    ahead_s: float  # admitted work ahead of it
    broken_job: str | None  # an on-time admitted job it would make late, if any
    earliest_deadline: float  # smallest deadline that would be feasible


class _Backlog:
    def __init__(self, jobs: Sequence[QueuedWork], now: float) -> None:
        self.jobs = sorted(jobs, key=lambda j: (j.deadline, j.job_id))
        self.deadlines = [j.deadline for j in self.jobs]
        self.before = [0.0, *itertools.accumulate(j.work_s for j in self.jobs)]  # work of the first k jobs
        slack = [j.deadline - now - self.before[i + 1] for i, j in enumerate(self.jobs)]
        # Smallest slack among on-time jobs from index k on (late jobs are already broken).
        self.min_slack_from = [math.inf] * (len(self.jobs) + 1)
        self.tightest_from: list[str | None] = [None] * (len(self.jobs) + 1)
        for i in range(len(self.jobs) - 1, -1, -1):
            self.min_slack_from[i], self.tightest_from[i] = self.min_slack_from[i + 1], self.tightest_from[i + 1]
            if 0 <= slack[i] < self.min_slack_from[i]:
                self.min_slack_from[i], self.tightest_from[i] = slack[i], self.jobs[i].job_id


def earliest_feasible_deadline(
    jobs: Sequence[QueuedWork], work_s: float, now: float, not_before: float = -math.inf
) -> float:
    """The smallest deadline >= ``not_before`` that :func:`check_deadline` would accept now."""
    return _earliest(_Backlog(jobs, now), work_s, now, not_before)


def _earliest(backlog: _Backlog, work_s: float, now: float, not_before: float) -> float:
    n = len(backlog.jobs)
    for k in range(n + 1):  # slot after the first k jobs; earlier slots give earlier deadlines
        if backlog.min_slack_from[k] < work_s:
            continue
        lower = max(now + backlog.before[k] + work_s, backlog.deadlines[k - 1] if k else -math.inf, not_before)
        if k == n or lower < backlog.deadlines[k]:
            return lower
    return math.inf  # unreachable: the last slot constrains nothing


def check_deadline(jobs: Sequence[QueuedWork], work_s: float, deadline: float, now: float) -> Feasibility:
    """Whether a job of ``work_s`` seconds with ``deadline`` fits; if not, the earliest later
    deadline that does (an earlier one may also fit, by jumping ahead of late jobs, but a user
    who asked for ``deadline`` wants to hear how much later to ask for)."""
    backlog = _Backlog(jobs, now)
    k = bisect.bisect_right(backlog.deadlines, deadline)
    completion = now + backlog.before[k] + work_s
    breaks = backlog.min_slack_from[k] < work_s
    feasible = completion <= deadline and not breaks
    return Feasibility(
        feasible=feasible,
        completion=completion,
        ahead_s=backlog.before[k],
        broken_job=backlog.tightest_from[k] if breaks else None,
        earliest_deadline=deadline if feasible else _earliest(backlog, work_s, now, deadline),
    )
