"""A restarted core takes back one request from its store (``ControlCore.restore`` reads the
store and calls ``restore_request`` for each record, in request-id order).

Life of a request through a restart, by the status its record holds:
- QUEUED: back in its tenant's fair queue; BACKOFF: back in the back-off heap, due when it was;
- RUNNING: it holds its tenant's slot and its pools' in-flight counts again, each live attempt
  is watched for stragglers again, and an attempt dispatched in the last
  ``resend_after_restart_s`` is sent again (a table write and a send are not one transaction, so
  its send may be lost; the same attempt id again is harmless) unless a pool of it is dead or
  unknown, or the canaries demoted its path for the request's tier since;
- FAILING: its final failed result is sent again (a result read twice counts once);
- DONE / FAILED: kept until its job is forgotten.
"""

from __future__ import annotations

import heapq

from phaseroute.streams.policy import Phase, measured_quality_refusal, path_quality

from .config import CoreConfig
from .decisions import Decision, Dispatch, FailRequest
from .dispatcher import Dispatcher
from .state import Attempt, RequestState, RequestStatus


def restore_request(d: Dispatcher, state: RequestState, config: CoreConfig, now: float) -> list[Decision]:
    """Put ``state`` back into the dispatcher; the decisions to send again."""
    d.requests[state.request_id] = state
    d.by_job.setdefault(state.job_id, set()).add(state.request_id)
    status = state.status
    if status is RequestStatus.QUEUED:
        d.fair.enqueue(state.work, now)
    elif status is RequestStatus.BACKOFF:
        heapq.heappush(d.backoff, (state.retry_at or now, d._next_seq(), state.request_id))
    elif status is RequestStatus.RUNNING:
        d.fair.resume(state.work)  # it holds its tenant's slot again
        attempts, state.attempts = state.attempts, []
        resend: list[Decision] = []
        for attempt in attempts:
            state.attempts.append(attempt)
            d.fleet.add_in_flight(attempt.pool, 1, state.work.total_tokens)
            d.on_pool.setdefault(attempt.pool, set()).add((state.request_id, attempt.number))
            d.watch(state, attempt, now)
            recent = now - attempt.started_at <= config.resend_after_restart_s
            if attempt.phase is Phase.PREFILL and recent and resendable(d, state, attempt, now):
                resend.append(Dispatch(state.work, state.custom_id, state.priority, attempt.number,
                                       attempt.prefill_pool, attempt.decode_pool, attempt.colocated,
                                       attempt.speculative, False))
        return resend
    elif status is RequestStatus.FAILING:
        return [FailRequest(state.work, state.custom_id, state.next_attempt, state.final_reason or "failed",
                            state.final_code or "request_failed")]
    return []


def resendable(d: Dispatcher, state: RequestState, attempt: Attempt, now: float) -> bool:
    """Both pools of the attempt are known and alive (a dead one's work is placed again
    anyway), and the canaries have not since demoted its path for the request's tier (if its
    first send was lost, the attempt times out and is placed again where the tier allows)."""
    fleet, dead = d.fleet, d.fleet.dead(now)
    if not all(fleet.known(p) and p not in dead for p in (attempt.prefill_pool, attempt.decode_pool)):
        return False
    measured = path_quality(d.table, state.work.model, attempt.prefill_pool, attempt.decode_pool, now)
    return measured is None or measured_quality_refusal(state.work, measured) is None
