"""The dispatching half of the control core: one pure, typed state machine that both the live
control plane and the simulator drive. Events in, decisions out; no Kafka, no Faust, no clock
(``now`` is passed in). Its other half, the job tracker (``tracker.JobTracker``), runs
partitioned by job id beside it.

Life of a request through the core:
``JobAdmitted`` (an admission desk's verdict) -> the job joins the admission backlog
(``jobs.JobBacklog``); in one process (the simulator) ``JobSubmitted`` -> ``admission.judge``
-> ``QueueRequest`` per request and ``JobChanged``; ``RequestQueued`` -> the fair queues
(``dispatcher.Dispatcher``); ``tick`` -> due back-offs, dead pools, stragglers (``recovery``),
then release + routing -> ``Dispatch``; ``KvReady`` / ``AttemptFailed`` / ``ResultReceived``
move requests on (retries, give-ups -> ``FailRequest``); ``JobEnded`` (the tracker's final
state of the job) fails the open requests of a cancelled or expired job and, once the job's
output is whole, forgets its requests -> ``Forget``; ``finished_job_ttl_s`` later the job itself
leaves (``JobBacklog.retire``). ``FleetObserved`` / ``ProfilesUpdated`` /
``TenantsUpdated`` refresh what the decisions read.

One bad event never stops the core: an exception while handling an event becomes a ``Problem``
decision (the shell logs it and dead-letters the event) and the core goes on; an exception
while placing one request in a tick fails that attempt (``Dispatcher.internal_error``). After
each event and each tick the changed jobs, requests and tenant counters are written to the
store, from which ``restore`` rebuilds a core after a restart. With ``write_behind`` they are
written only when the driver calls ``flush``: a request passes through several states between
two flushes, so the store gets one write where it got several. That is safe for a driver that
commits the events it read only after a ``flush`` (the Faust shell flushes before every offset
commit, and every second): a crash loses only state that the events read again rebuild, or that
a tick decides again (a dispatch not written goes again with the same attempt id; a forget not
written happens again).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any

from phaseroute.schemas.enums import JobState
from phaseroute.streams.policy import FleetRate, Phase, RequestWork, fleet_rate

from . import recovery, restoring
from .admission import judge
from .config import CoreConfig
from .decisions import Decision, FailRequest, Forget, Problem
from .dispatcher import Dispatcher, Reports
from .events import (
    AttemptFailed,
    CancelRequested,
    Event,
    FleetObserved,
    JobAdmitted,
    JobEnded,
    JobSubmitted,
    KvReady,
    ProfilesUpdated,
    RequestQueued,
    ResultReceived,
    TenantsUpdated,
)
from .jobs import JobBacklog
from .state import JobRecord, RequestState
from .store import CoreStore, NullStore

_ENDS = {JobState.CANCELLED: "cancelled", JobState.EXPIRED: "expired"}  # final states that fail open requests


class ControlCore:
    def __init__(self, config: CoreConfig, store: CoreStore | None = None, seed: int = 0,
                 write_behind: bool = False) -> None:
        self.config = config
        self.store: CoreStore = store if store is not None else NullStore()
        self.write_behind = write_behind  # the store is written by ``flush`` only
        self.jobs = JobBacklog(config)
        self.dispatch = Dispatcher(config, random.Random(seed))
        self.quotas = dict(config.quotas)
        self._tenants_saved: dict[str, tuple[float, float]] = {}
        self._serving: frozenset[tuple[str, frozenset[Phase], frozenset[str]]] = frozenset()
        self._forgetting: deque[tuple[str, list[str]]] = deque()  # finished jobs' requests still to forget
        self.admissions_through = 0.0  # the latest verdict time among the desks' verdicts taken
        self._handlers: dict[type, Callable[[Any, float], list[Decision]]] = {
            JobSubmitted: self._submitted, JobAdmitted: self._admitted, RequestQueued: self._queued, KvReady: self._kv_ready,
            ResultReceived: self._result, AttemptFailed: self._attempt_failed, JobEnded: self._job_ended,
            CancelRequested: self._cancel, FleetObserved: self._fleet, ProfilesUpdated: self._profiles,
            TenantsUpdated: self._tenants,
        }

    # -- the two entry points ------------------------------------------------------------------
    def handle(self, event: Event, now: float) -> list[Decision]:
        """Fold one event into the state; the decisions it leads to."""
        try:
            out = self._handlers[type(event)](event, now)
        except Exception as exc:  # one bad event must not stop the control plane
            reason = f"{type(exc).__name__}: {exc}"
            out = [Problem(type(event).__name__, reason, event)]
            if isinstance(event, RequestQueued):
                out += self._quarantine(event, reason, now)
        if not self.write_behind:
            self.flush()
        return out

    def tick(self, now: float) -> list[Decision]:
        """The clock: requests and jobs done with leave, then due back-offs, dead pools, stragglers,
        then release and placement (at most ``max_releases_per_tick``: see ``more_to_release``)."""
        out: list[Decision] = []
        steps: tuple[tuple[str, Callable[[float], list[Decision] | None]], ...] = (
            ("forget", lambda t: self._forget_some()),
            ("retire jobs", lambda t: self.jobs.retire(t, self._holds_requests)),
            ("backoff", lambda t: recovery.requeue_due(self.dispatch, t)),
            ("dead pools", lambda t: recovery.redispatch_dead_pools(self.dispatch, t)),
            ("stragglers", lambda t: recovery.speculate(self.dispatch, t)), ("release", self.dispatch.release),
        )
        self.dispatch.fleet.age(now)
        for name, step in steps:
            try:
                out += step(now) or []
            except Exception as exc:  # one failing step must not stop the others
                out.append(Problem(f"tick/{name}", f"{type(exc).__name__}: {exc}"))
        if not self.write_behind:
            self.flush()
        return out

    @property
    def more_to_release(self) -> bool:
        """The last tick stopped releasing at ``max_releases_per_tick`` while the fleet had more
        free slots: tick again now. Each tick releases a bounded slice in the fair scheduler's
        order (its counters carry over), so the slices together release as much as one unbounded
        tick; only a release unit cut at a slice's end can change which tenant goes next."""
        return self.dispatch.capped

    # -- events --------------------------------------------------------------------------------
    def _submitted(self, ev: JobSubmitted, now: float) -> list[Decision]:
        verdict = judge(ev, self.jobs.jobs.get(ev.job_id), self.jobs.backlog(), self.dispatch.fleet.states(),
                        self.dispatch.table, self.quotas, self.config, now)
        return verdict.decisions + (self._take(verdict.job, now) if verdict.fresh else [])

    def _admitted(self, ev: JobAdmitted, now: float) -> list[Decision]:
        """A desk's verdict; a replay of one taken already (same or older submission) changes nothing."""
        self.admissions_through = max(self.admissions_through, ev.at)
        return self._take(ev.job, now)

    def _take(self, job: JobRecord, now: float) -> list[Decision]:
        """The backlog takes a judged job. Its requests may have come first (the desk sends the
        verdict before them, but the dispatcher reads the two topics apart): the ones that
        ended leave its backlog at once."""
        if not self.jobs.take(job, now) or job.state is not JobState.ADMITTED:
            return []
        for rid in self.dispatch.by_job.get(job.job_id, ()):
            state = self.dispatch.requests[rid]
            if not state.status.is_open:
                self.jobs.on_request_closed(job.job_id, state.work.prompt_tokens, state.work.max_output_tokens)
        return []

    def _queued(self, ev: RequestQueued, now: float) -> list[Decision]:
        if self.jobs.is_whole(ev.job_id):
            return []  # a replay: every request of the job ended (and was forgotten)
        return self._closing(self.dispatch.queue(ev, now, self.job_is_open(ev.job_id)))

    def _quarantine(self, ev: RequestQueued, reason: str, now: float) -> list[Decision]:
        """An admitted request whose arrival could not be handled still needs its one line: it
        ends failing, with the reason (its job then finishes instead of waiting for it forever)."""
        try:
            if ev.request_id in self.dispatch.requests:
                state = self.dispatch.requests[ev.request_id]
            else:
                work = RequestWork(ev.request_id, ev.job_id, ev.tenant, ev.model, max(ev.prompt_tokens, 1),
                                   max(ev.max_tokens, 1), ev.deadline, ev.quality_tier)
                state = RequestState(work, ev.custom_id, ev.priority)
                self.dispatch.add(state)
            return self._closing(self.dispatch.fail(state, f"the control plane could not take this request: {reason}",
                                                    "internal_error", now))
        except Exception as exc:
            return [Problem("RequestQueued", f"and failing it raised {type(exc).__name__}: {exc}", ev)]

    def _kv_ready(self, ev: KvReady, now: float) -> list[Decision]:
        self.dispatch.kv_ready(ev, now)
        return []

    def _result(self, ev: ResultReceived, now: float) -> list[Decision]:
        """A request's first result ends it (a later one, a copy or a replay, changes nothing); a
        request of a job whose output is whole already is forgotten at once."""
        closed = self.dispatch.result(ev, now)
        if closed is None:
            return []
        if closed.tenant == self.config.canary_tenant:  # a drift canary belongs to no job: done with at once
            self.dispatch.forget(ev.request_id)
            return []
        if closed.was_open:
            self.jobs.on_request_closed(closed.job_id, closed.prompt_tokens, closed.max_tokens)
        if self.jobs.is_whole(closed.job_id):
            self.dispatch.forget(ev.request_id)
            return [Forget(closed.job_id, (ev.request_id,))]
        return []

    def _attempt_failed(self, ev: AttemptFailed, now: float) -> list[Decision]:
        return self._closing(self.dispatch.attempt_failed(ev, now))

    def _cancel(self, ev: CancelRequested, now: float) -> list[Decision]:
        """A drift canary round's cancel: its canaries still queued are withdrawn. A tenant's job
        is cancelled by its tracker, whose final state comes back as ``JobEnded``."""
        if ev.tenant != self.config.canary_tenant:
            return []
        return self.dispatch.withdraw_queued(ev.job_id, f"withdrawn: {ev.reason}", "canary_withdrawn", now)

    def _job_ended(self, ev: JobEnded, now: float) -> list[Decision]:
        """The tracker's final state of a job: a CANCELLED or EXPIRED one fails its open requests
        (the first time it says so); one whose output is whole has its requests forgotten."""
        known = self.jobs.jobs.get(ev.job_id)
        before = known.state if known is not None else None
        self.jobs.end(ev, now)
        out: list[Decision] = []
        if ev.state in _ENDS and before is not ev.state:
            what = _ENDS[ev.state]
            out += self._closing(self.dispatch.fail_job(ev.job_id, f"{what}: {ev.reason}", f"batch_{what}", now))
        return out + self._forget_if_whole(ev.job_id)

    def _fleet(self, ev: FleetObserved, now: float) -> list[Decision]:
        """The pools as heartbeats say now. When the set of pools that can serve changes (one
        came alive, went down, or changed what it serves), the router's traffic-share targets
        are refreshed too: otherwise a pool that appeared after the last profile change had no
        target until the profiles changed again, and every pick went to the best-scored pool."""
        d = self.dispatch
        d.fleet.observe(ev.pools)
        serving = frozenset((p.name, p.phases, p.models) for p in ev.pools if p.alive)
        if serving != self._serving:
            self._serving = serving
            d.router_state.refresh(d.fleet.states(), d.table, self.config.router, now)
        return []

    def _profiles(self, ev: ProfilesUpdated, now: float) -> list[Decision]:
        d = self.dispatch
        d.table = ev.table
        d.fleet.learn_kv_sizes(ev.table)
        d.router_state.refresh(d.fleet.states(), ev.table, self.config.router, now)
        d.fleet_cost_per_s = self._fleet_cost_rate(now)
        return []

    def _tenants(self, ev: TenantsUpdated, now: float) -> list[Decision]:
        self.dispatch.fair.config = self.config.fair_with_canaries(ev.fair)
        self.quotas = dict(ev.quotas)
        return []

    # -- helpers -------------------------------------------------------------------------------
    def _closing(self, out: list[Decision]) -> list[Decision]:
        """Requests that start failing leave their job's backlog."""
        for decision in out:
            if isinstance(decision, FailRequest):
                self.jobs.on_request_closed(decision.work.job_id, decision.work.prompt_tokens,
                                            decision.work.max_output_tokens)
        return out

    def _forget_if_whole(self, job_id: str) -> list[Decision]:
        """A job whose output is whole is done with: its finished requests leave the state and the
        store, ``forget_per_step`` now and as many on each tick after (``_forget_some``); one
        whose result this dispatcher has not read yet (a failing one may still have attempts
        running) goes when it is read (``_result``). Until
        then a late event of one finds it finished, as it would find it gone."""
        ids_of_job = self.dispatch.by_job.get(job_id)
        if not ids_of_job or not self.jobs.is_whole(job_id):
            return []
        requests = self.dispatch.requests
        ids = {rid for rid in ids_of_job if requests[rid].status.is_finished}
        ids_of_job -= ids
        if not ids_of_job:
            del self.dispatch.by_job[job_id]
        if not ids:
            return []
        self._forgetting.append((job_id, sorted(ids, reverse=True)))
        return self._forget_some()

    def _holds_requests(self, job_id: str) -> bool:
        """Some request of the job is still in the state (open, or still to be forgotten)."""
        return job_id in self.dispatch.by_job or any(job == job_id for job, _ in self._forgetting)

    def _forget_some(self) -> list[Decision]:
        """Forget at most ``forget_per_step`` requests of finished jobs, oldest job first."""
        budget = self.config.forget_per_step
        out: list[Decision] = []
        while self._forgetting and budget > 0:
            job_id, ids = self._forgetting[0]
            now_gone = ids[-budget:]
            del ids[-budget:]
            for rid in now_gone:
                self.dispatch.requests.pop(rid, None)
                self.dispatch.dirty.add(rid)
            out.append(Forget(job_id, tuple(reversed(now_gone))))
            budget -= len(now_gone)
            if not ids:
                self._forgetting.popleft()
        return out

    def _fleet_cost_rate(self, now: float) -> float | None:
        """Measured fleet throughput in the fair scheduler's cost units per second, at the mix of
        the admitted backlog (it sharpens the deadline slack of urgent tenants)."""
        d, fair = self.dispatch, self.dispatch.fair.config
        pools, rate = d.fleet.states(), 0.0
        by_model: dict[str, list[float]] = {}
        for job in self.jobs.open.values():
            acc = by_model.setdefault(job.model, [0.0, 0.0])
            acc[0] += job.prefill_left
            acc[1] += job.decode_left
        for model in self.config.models:
            measured = fleet_rate(model, pools, d.table, now, self.config.router.confidence)
            pre, dec = measured.prefill_tokens_per_s, measured.decode_tokens_per_s
            tokens_in, tokens_out = by_model.get(model, [1.0, 1.0])
            if pre > 0 and dec > 0 and tokens_in + tokens_out > 0:
                rate += fair.cost(tokens_in, tokens_out) / (tokens_in / pre + tokens_out / dec)
        return rate or None

    def fleet_rates(self, now: float) -> dict[str, FleetRate]:
        """The fleet's rate per served model as admission counts it, from the dispatcher's view of
        the pools (the alive ones) and profiles: the load snapshot carries it to the desks."""
        d, pools = self.dispatch, self.dispatch.fleet.states()
        return {model: fleet_rate(model, pools, d.table, now, self.config.admission.confidence) for model in self.config.models}

    def job_is_open(self, job_id: str) -> bool:
        """False once the job finished (cancelled, expired, done): a request of it that arrives
        late ends at once, so the shell need not keep its prompt text."""
        job = self.jobs.jobs.get(job_id)
        return job is None or not job.state.is_finished

    @property
    def reports(self) -> Reports:
        return self.dispatch.reports

    # -- persistence ---------------------------------------------------------------------------
    def flush(self) -> None:
        """Write what changed since the last write to the store (with ``write_behind``: before
        the driver commits the events it read)."""
        d, jobs, store = self.dispatch, self.jobs, self.store
        if not store.enabled:
            d.dirty.clear()
            jobs.dirty.clear()
            jobs.dropped.clear()
            return
        for rid in d.dirty:
            state = d.requests.get(rid)
            if state is None:
                store.requests.pop(rid, None)
            else:
                store.requests[rid] = state.to_record()
        for job_id in jobs.dirty:
            store.jobs[job_id] = jobs.jobs[job_id].to_record()
        for job_id in jobs.dropped:
            store.jobs.pop(job_id, None)
        for tenant, (counter, served) in d.tenants_changed(self._tenants_saved).items():
            store.tenants[tenant] = {"counter": counter, "served_cost": served}
        d.dirty.clear()
        jobs.dirty.clear()
        jobs.dropped.clear()

    def restore(self, now: float) -> list[Decision]:
        """Rebuild the state from the store (a restart; tell the core the fleet first: it sends
        again only to pools it knows alive); the decisions to send again: the final
        failed results of requests that were failing (a result read twice counts once) and the
        attempts dispatched in the last ``resend_after_restart_s`` (their sends may be lost); and
        the requests of finished jobs that a stop left unforgotten start leaving again."""
        d, store = self.dispatch, self.store
        saved = {t: (float(v["counter"]), float(v["served_cost"])) for t, v in store.tenants.items()}
        d.fair.restore(saved)
        self._tenants_saved = dict(saved)
        for record in store.jobs.values():
            self.jobs.restore(JobRecord.from_record(record), now)
        out: list[Decision] = []
        for rid, record in sorted(store.requests.items()):
            state = RequestState.from_record(rid, record)
            out += restoring.restore_request(self.dispatch, state, self.config, now)
        d.dirty.clear()
        self.jobs.dirty.clear()
        for job_id in list(d.by_job):
            out += self._forget_if_whole(job_id)
        self.flush()
        return out

    def job_state(self, job_id: str) -> JobState | None:
        job = self.jobs.jobs.get(job_id)
        return None if job is None else job.state
