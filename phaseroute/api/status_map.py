"""phaseroute job states -> the eight OpenAI batch statuses (pure; no I/O).

| phaseroute (``jobs.state``)                         | OpenAI status |
|-----------------------------------------------------|---------------|
| no event yet, or SUBMITTED                          | validating    |
| REJECTED (invalid file, infeasible window, quota)   | failed        |
| ADMITTED, RUNNING                                   | in_progress   |
| RUNNING with every request finished (lines pending) | finalizing    |
| COMPLETED                                           | completed     |
| FAILED with requests (every request failed)         | completed     |
| FAILED without requests                             | failed        |
| a cancel was asked, state not yet final             | cancelling    |
| CANCELLED, some request's line not yet written      | cancelling    |
| CANCELLED with its output whole                     | cancelled     |
| EXPIRED                                             | expired       |

As at OpenAI, a batch whose requests all failed is ``completed`` with no output file and an
error file. A cancelled batch stays ``cancelling`` until every request has its line (the ones
still queued when the cancel came end ``batch_cancelled``), so its files are whole when it is
``cancelled``. Timestamps are unix seconds of the first event that reached each stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phaseroute.api.wire import BatchStatus
from phaseroute.schemas.enums import JobState


@dataclass
class JobTrack:
    """What the API knows of one job from ``jobs.state`` / ``jobs.events``."""

    latest: dict[str, Any]
    first_at: dict[str, int] = field(default_factory=dict)  # state, "finalizing" or "cancelled" -> epoch ms
    _seen: set[str] = field(default_factory=set)

    def update(self, event: dict[str, Any]) -> None:
        """Keep the event of the furthest stage (then the latest); note when each stage began."""
        held = self.latest
        if (JobState(event["state"]).stage, event["at"]) >= (JobState(held["state"]).stage, held["at"]):
            self.latest = event
        self.note(event)

    def note(self, event: dict[str, Any]) -> None:
        state = event["state"]
        self._first(state, event["at"])
        total = event.get("requests_total") or 0
        if total and event["requests_done"] + event["requests_failed"] >= total:
            self._first("finalizing", event["at"])
        if state == JobState.CANCELLED.value and output_whole(event):
            self._first("cancelled", event["at"])

    def _first(self, stage: str, at: int) -> None:
        if stage not in self.first_at or at < self.first_at[stage]:
            self.first_at[stage] = at


def output_whole(event: dict[str, Any]) -> bool:
    """Every request of the job has its result and a durable line, as the core counts them (a job
    without requests has nothing to write)."""
    total = event.get("requests_total") or 0
    finished = event["requests_done"] + event["requests_failed"]
    return finished >= total and (event.get("lines_written") or 0) >= total


def batch_status(track: JobTrack | None, cancel_requested: bool) -> BatchStatus:
    if track is None:
        return "cancelling" if cancel_requested else "validating"
    event = track.latest
    state = JobState(event["state"])
    total, finished = event.get("requests_total") or 0, event["requests_done"] + event["requests_failed"]
    if state is JobState.REJECTED:
        return "failed"
    if state is JobState.COMPLETED:
        return "completed"
    if state is JobState.FAILED:
        return "completed" if total else "failed"
    if state is JobState.CANCELLED:
        return "cancelled" if output_whole(event) else "cancelling"
    if state is JobState.EXPIRED:
        return "expired"
    if cancel_requested:
        return "cancelling"
    if state is JobState.SUBMITTED:
        return "validating"
    return "finalizing" if total and finished >= total else "in_progress"


def seconds(ms: int | None) -> int | None:
    return None if ms is None else int(ms // 1000)


def timestamps(track: JobTrack | None, status: str) -> dict[str, int | None]:
    """The batch's ``*_at`` fields that the job's events reached."""
    if track is None:
        return {}
    first = track.first_at
    started = min((first[s] for s in ("ADMITTED", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "EXPIRED")
                   if s in first and (s in ("ADMITTED", "RUNNING") or track.latest.get("requests_total"))), default=None)
    out: dict[str, int | None] = {"in_progress_at": seconds(started)}
    if status in ("finalizing", "completed"):
        out["finalizing_at"] = seconds(first.get("finalizing") or first.get("COMPLETED") or first.get("FAILED"))
    if status == "completed":
        out["completed_at"] = seconds(first.get("COMPLETED") or first.get("FAILED"))
    if status == "failed":
        out["failed_at"] = seconds(first.get("REJECTED") or first.get("FAILED"))
    if status == "cancelled":
        out["cancelled_at"] = seconds(first.get("cancelled") or first.get("CANCELLED"))
    if status == "expired":
        out["expired_at"] = seconds(first.get("EXPIRED"))
    return out
