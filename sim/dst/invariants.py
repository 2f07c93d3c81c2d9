"""What must hold of the control core after every event of a deterministic simulation, and at
the end of the run.

After every event (safety):
- ``no_problem``: no exception escaped a handler or the tick (a ``Problem`` decision is one);
- ``ends_once``: a request that ended (its first result was read) is not dispatched again while
  no restart intervened (a restart that lost the core's last writes may run it once more; the
  sink keeps one line per request, which ``every_request_ended`` checks);
- ``counts``: no tenant's in-flight count and no pool's in-flight count is negative, no tenant
  holds more than its cap;
- ``fair_share``: no tenant is served in a tick while its VTC counter was more than
  ``fairness_bound`` ahead of another tenant that waited (backlogged, under its cap) — VTC's
  guarantee; a tenant may well be far ahead (it was served while nobody else waited), it only
  must not be served then;
- ``alive_target``: work goes only to pools the core has heard from and does not hold dead;
- ``exact_quality``: EXACT-tier work never goes to a path the quality policy demoted.
At the end, after the fleet recovered and the run drained (liveness):
- ``every_request_ended``: each admitted request has exactly one result line (done or failed);
- ``jobs_final``: every admitted job is in a final state with its output whole;
- ``slots_free``: no tenant slot, no pool in-flight count and no request state is left over.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from phaseroute.schemas.enums import JobState, QualityTier
from phaseroute.streams.core import ControlCore, Decision, Dispatch, JobRecord, Problem
from phaseroute.streams.policy import TenantReport


class Violation(AssertionError):
    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


@dataclass
class Ledger:
    """Requests the harness saw end (request id -> the restart epoch they ended in)."""

    ended: dict[str, int]
    epoch: int = 0

    def __init__(self) -> None:
        self.ended = {}
        self.epoch = 0


def after_event(core: ControlCore, decisions: Iterable[Decision], ledger: Ledger, now: float) -> None:
    d = core.dispatch
    dead = d.fleet.dead(now)
    for decision in decisions:
        if isinstance(decision, Problem):
            raise Violation("no_problem", f"{decision.where}: {decision.reason}")
        if isinstance(decision, Dispatch) and ledger.ended.get(decision.work.request_id) == ledger.epoch:
            raise Violation("ends_once", f"Dispatch for request {decision.work.request_id}, which had ended already")
        if isinstance(decision, Dispatch):
            for pool in {decision.prefill_pool, decision.decode_pool}:
                if not d.fleet.known(pool) or pool in dead:
                    raise Violation("alive_target", f"request {decision.work.request_id} sent to {pool}, which "
                                                    f"is {'dead' if pool in dead else 'unknown'}")
            if decision.work.quality_tier is QualityTier.EXACT:
                key = (decision.work.model, decision.prefill_pool, decision.decode_pool)
                measured = d.table.quality.get(key)
                if measured is not None and not measured.exact_ok:
                    raise Violation("exact_quality", f"EXACT request {decision.work.request_id} on demoted path {key}")
    for report in d.fair.report():
        if report.in_flight < 0 or report.in_flight > report.max_in_flight:
            raise Violation("counts", f"tenant {report.tenant} holds {report.in_flight} slots (cap {report.max_in_flight})")
    for pool, n in d.fleet._in_flight.items():
        if n < 0:
            raise Violation("counts", f"pool {pool} has {n} attempts in flight")


def fair_share(core: ControlCore, before: tuple[TenantReport, ...]) -> None:
    """``before``: the fair scheduler's report at the start of the tick just run."""
    fair = core.dispatch.fair
    after = {r.tenant: r for r in fair.report()}
    # waited: backlogged and under its cap all through the tick, even counting what it was released
    # (a release given back because no pool could place it still took the tenant's slot then)
    released = core.dispatch.released
    waiting = [r for r in before if r.queued_requests > 0 and after[r.tenant].queued_requests > 0
               and r.in_flight + released.get(r.tenant, 0) < r.max_in_flight]
    bound = fair.fairness_bound()
    for r in before:
        served = after[r.tenant].served_cost > r.served_cost + 1e-6
        others = [o.counter for o in waiting if o.tenant != r.tenant]
        if served and others and r.counter > min(others) + bound + 1e-6:
            raise Violation("fair_share", f"tenant {r.tenant} was served at counter {r.counter:.0f} while another "
                                          f"waited at {min(others):.0f} (bound {bound:.0f})")


def at_end(core: ControlCore, tracked: Mapping[str, JobRecord], admitted: dict[str, int],
           lines: dict[str, dict[str, int]]) -> None:
    """``tracked``: the job tracker's jobs; ``admitted``: job -> requests admitted; ``lines``: job ->
    request id -> lines the sink wrote."""
    for job_id, total in sorted(admitted.items()):
        got = lines.get(job_id, {})
        twice = [rid for rid, n in got.items() if n != 1]
        if len(got) != total or twice:
            raise Violation("every_request_ended", f"job {job_id}: {len(got)} of {total} requests have a line"
                                                   + (f"; {len(twice)} have more than one" if twice else ""))
        job = tracked.get(job_id)
        if job is None or not job.state.is_finished or job.state is JobState.REJECTED:
            raise Violation("jobs_final", f"job {job_id} is {None if job is None else job.state.name}, not final")
        if job.finished_requests != total or job.lines_written < total:
            raise Violation("jobs_final", f"job {job_id} counted {job.finished_requests}/{total} results and "
                                          f"{job.lines_written} lines")
    d = core.dispatch
    busy = {r.tenant: r.in_flight for r in d.fair.report() if r.in_flight or r.queued_requests}
    pools = {p: n for p, n in d.fleet._in_flight.items() if n}
    if busy or pools or d.requests or d.by_job:
        raise Violation("slots_free", f"left over: tenant slots {busy}, pool in-flight {pools}, "
                                      f"{len(d.requests)} request states, {len(d.by_job)} job indexes")
