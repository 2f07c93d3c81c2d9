"""One batch as the SDK sees it: the stored create request joined with the job's events.

Statuses and timestamps come from ``status_map``; counts and usage from the job's latest
event; ``errors`` of a failed batch are the input file's line errors (written by intake) or
the rejection reason (an infeasible window names the earliest feasible deadline as an ISO
time); output and error files are assembled once the batch is final (``outputs``). A cancel
asked while the job was not yet admitted is sent again until the job ends.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from phaseroute.api.outputs import assemble
from phaseroute.api.status_map import JobTrack, batch_status, timestamps
from phaseroute.api.wire import (
    Batch,
    BatchError,
    BatchErrors,
    BatchUsage,
    RequestCounts,
)
from phaseroute.schemas.enums import JobState
from phaseroute.streams.validation_report import read_validation_errors

FINAL = ("completed", "failed", "cancelled", "expired")
RESEND_CANCEL_S = 5.0


def _rejection(track: JobTrack) -> BatchErrors:
    event = track.latest
    reason = event.get("reason") or f"the job ended {event['state']}"
    code = "job_failed"
    if event["state"] == "REJECTED":
        code = "infeasible_completion_window" if event.get("earliest_feasible_deadline") else "batch_rejected"
        earliest = event.get("earliest_feasible_deadline")
        if earliest and "resubmit" not in reason:
            when = datetime.fromtimestamp(earliest / 1000, UTC).isoformat(timespec="seconds")
            reason += f" (the earliest feasible deadline is {when})"
    return BatchErrors(data=[BatchError(code=code, message=reason)])


def batch_view(state: Any, record: dict[str, Any]) -> Batch:
    track = state.jobs.get(record["id"])
    status = batch_status(track, bool(record.get("cancelling_at")))
    fields: dict[str, Any] = dict(timestamps(track, status))
    if record.get("cancelling_at") and status in ("cancelling", "cancelled"):
        fields["cancelling_at"] = record["cancelling_at"]
    if (status == "cancelling" and track is not None and not JobState(track.latest["state"]).is_finished
            and time.time() - record.get("cancel_sent_at", 0) > RESEND_CANCEL_S):
        state.send_cancel(record)
    errors = None
    if status == "failed" and track is not None:
        report = read_validation_errors(state.store, record["tenant"], record["id"])
        errors = (BatchErrors(data=[BatchError(**e) for e in report["data"]]) if report else _rejection(track))
    output_id = error_id = None
    if status in FINAL and status != "failed":
        finished = fields.get("completed_at") or fields.get("cancelled_at") or fields.get("expired_at") or int(time.time())
        output_id, error_id = assemble(state.store, state.files, record, int(finished))
    counts, usage = RequestCounts(), None
    if track is not None:
        event = track.latest
        counts = RequestCounts(total=event.get("requests_total") or 0, completed=event["requests_done"],
                               failed=event["requests_failed"])
        usage = BatchUsage(input_tokens=event["tokens_in"], output_tokens=event["tokens_out"],
                           total_tokens=event["tokens_in"] + event["tokens_out"])
    return Batch(
        id=record["id"], endpoint=record["endpoint"], errors=errors, input_file_id=record["input_file_id"],
        completion_window=record["completion_window"], status=status, output_file_id=output_id,
        error_file_id=error_id, created_at=record["created_at"], expires_at=record["expires_at"],
        request_counts=counts, metadata=record.get("metadata") or None, model=record.get("model"), usage=usage,
        **fields,
    )
