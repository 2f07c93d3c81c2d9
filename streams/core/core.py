"""The control core: one pure, typed state machine that both the live control plane and the
simulator drive. Events in, decisions out; no Kafka, no Faust, no clock (``now`` is passed in).

Life of a job through the core:
``JobSubmitted`` -> admission (``admission.judge``) -> ``QueueRequest`` per request, ``JobChanged``,
and the tracker (``jobs.JobBook``) takes the job; or, when admission ran elsewhere (the live
admission desks), ``JobAdmitted`` -> the tracker takes the desk's verdict;
``RequestQueued`` -> the fair queues (``dispatcher.Dispatcher``); ``tick`` -> expiries, due
back-offs, dead pools, stragglers (``recovery``), then release + routing -> ``Dispatch``;
``KvReady`` / ``AttemptFailed`` / ``ResultReceived`` move requests on (retries, give-ups ->
``FailRequest``); ``OutputWritten`` completes a job once its output is whole -> ``Forget``.
``FleetObserved`` / ``ProfilesUpdated`` / ``TenantsUpdated`` refresh what the decisions read.

One bad event never stops the core: an exception while handling an event becomes a ``Problem``
decision (the shell logs it and dead-letters the event) and the core goes on; an exception
while placing one request in a tick fails that attempt (``Dispatcher.internal_error``). After
each event and each tick the changed jobs, requests and tenant counters are written to the
store, from which ``restore`` rebuilds a core after a restart. With ``write_behind`` they are
written only when the driver calls ``flush``: a job's counters change with every result and a
request passes through several states between two flushes, so the store gets one write where it
got several. That is safe for a driver that commits the events it read only after a ``flush``
(the Faust shell flushes before every offset commit, and every second): a crash loses only state
that the events read again rebuild, or that a tick decides again (a dispatch not written goes
again with the same attempt id; an expiry or a forget not written happens again).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any

from phaseroute.schemas.enums import JobEventKind, JobState
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
    JobSubmitted,
    KvReady,
    OutputWritten,
    ProfilesUpdated,
    RequestQueued,
    ResultReceived,
    TenantsUpdated,
)
from .jobs import JobBook, changed, output_whole
from .state import JobRecord, RequestState, RequestStatus
from .store import CoreStore, NullStore


class ControlCore:
    def __init__(self, config: CoreConfig, store: CoreStore | None = None, seed: int = 0,
                 write_behind: bool = False) -> None:
        self.config = config
        self.store: CoreStore = store if store is not None else NullStore()
        self.write_behind = write_behind  # the store is written by ``flush`` only
        self.jobs = JobBook(config)
        self.dispatch = Dispatcher(config, random.Random(seed))
        self.quotas = dict(config.quotas)
        self._tenants_saved: dict[str, tuple[float, float]] = {}
        self._serving: frozenset[tuple[str, frozenset[Phase], frozenset[str]]] = frozenset()
        self._forgetting: deque[tuple[str, list[str]]] = deque()  # finished jobs' requests still to forget
        # events of a job whose verdict the tracker has not read yet (its requests came first), by job
        self._early: dict[str, list[tuple[float, ResultReceived | OutputWritten | CancelRequested]]] = {}
        self.admissions_through = 0.0  # the latest verdict time among the desks' verdicts taken
        self._handlers: dict[type, Callable[[Any, float], list[Decision]]] = {
            JobSubmitted: self._submitted, JobAdmitted: self._admitted, RequestQueued: self._queued, KvReady: self._kv_ready,
            ResultReceived: self._result, AttemptFailed: self._attempt_failed, OutputWritten: self._output_written,
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
        """The clock: expiries, due back-offs, dead pools, stragglers, then release and placement
        (at most ``max_releases_per_tick``: see ``more_to_release``)."""
        out: list[Decision] = []
        steps: tuple[tuple[str, Callable[[float], list[Decision] | None]], ...] = (
            ("forget", lambda t: self._forget_some()), ("early", self._drop_stale_early),
            ("expire", self._expire), ("backoff", lambda t: recovery.requeue_due(self.dispatch, t)),
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
        known = self.jobs.jobs.get(ev.job.job_id)
        if known is not None and known.submissions >= ev.job.submissions:
            return []
        return self._take(ev.job, now)

    def _take(self, job: JobRecord, now: float) -> list[Decision]:
        """The tracker takes a judged job. Its requests may have come first (the desk sends the
        verdict before them, but the tracker reads the two topics apart): the ones that ended
        leave its backlog, and the results, receipts and cancels that found no job are applied now."""
        self.jobs.take(job)
        if job.state is not JobState.ADMITTED:
            return []
        for rid in self.dispatch.by_job.get(job.job_id, ()):
            state = self.dispatch.requests[rid]
            if not state.status.is_open:
                self.jobs.on_request_closed(job.job_id, state.work.prompt_tokens, state.work.max_output_tokens)
        out: list[Decision] = []
        for _, early in self._early.pop(job.job_id, []):
            if isinstance(early, ResultReceived):
                out += self.jobs.on_result(job.job_id, early.ok, early.prompt_tokens, early.completion_tokens, now)
            else:
                out += self._handlers[type(early)](early, now)
        return out + self._forget_if_whole(job.job_id)

    def _wait_for_job(self, job_id: str, event: ResultReceived | OutputWritten | CancelRequested, now: float) -> bool:
        """True when ``job_id`` has no verdict here yet: the event waits for it (in memory, up to
        ``early_event_ttl_s``; a job id that never comes was no job of this deployment)."""
        if job_id in self.jobs.jobs:
            return False
        self._early.setdefault(job_id, []).append((now, event))
        return True

    def _drop_stale_early(self, now: float) -> list[Decision]:
        cutoff = now - self.config.early_event_ttl_s
        for job_id in [j for j, events in self._early.items() if events[0][0] < cutoff]:
            del self._early[job_id]
        return []

    def _queued(self, ev: RequestQueued, now: float) -> list[Decision]:
        job = self.jobs.jobs.get(ev.job_id)
        if job is not None and job.state.is_finished and output_whole(job):
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
        closed = self.dispatch.result(ev, now)
        if closed is None:
            return []
        if closed.tenant == self.config.canary_tenant:  # a drift canary belongs to no job: done with at once
            self.dispatch.forget(ev.request_id)
            return []
        if self._wait_for_job(closed.job_id, ev, now):
            return []
        if closed.was_open:
            self.jobs.on_request_closed(closed.job_id, closed.prompt_tokens, closed.max_tokens)
        out = self.jobs.on_result(closed.job_id, closed.ok, ev.prompt_tokens, ev.completion_tokens, now)
        return out + self._forget_if_whole(closed.job_id)

    def _attempt_failed(self, ev: AttemptFailed, now: float) -> list[Decision]:
        return self._closing(self.dispatch.attempt_failed(ev, now))

    def _output_written(self, ev: OutputWritten, now: float) -> list[Decision]:
        if self._wait_for_job(ev.job_id, ev, now):
            return []
        self._reconcile(ev.job_id, ev.lines)
        return self.jobs.on_output_written(ev.job_id, ev.lines, now) + self._forget_if_whole(ev.job_id)

    def _reconcile(self, job_id: str, lines: int) -> None:
        """The sink wrote every line but the job counted fewer results (a result whose handling
        broke half-way): recount from the requests' own states, which are the truth. Only a
        receipt of the whole output asks: the sink is ahead of the control plane's results
        whenever the control plane has a backlog, and a recount is a pass over the job's requests
        (a pass on every receipt took half the control plane's time on a 50,000-request job)."""
        job = self.jobs.jobs.get(job_id)
        ids = self.dispatch.by_job.get(job_id)
        if job is None or not ids or lines <= job.finished_requests or lines < job.requests_total:
            return
        states = [self.dispatch.requests[rid].status for rid in ids]
        done = sum(s is RequestStatus.DONE for s in states)
        failed = sum(s is RequestStatus.FAILED for s in states)
        if done + failed > job.finished_requests:
            job.done, job.failed = done, failed
            self.jobs.dirty.add(job_id)

    def _cancel(self, ev: CancelRequested, now: float) -> list[Decision]:
        job = self.jobs.cancel(ev.job_id, ev.tenant, ev.reason, now)
        if job is None and ev.tenant == self.config.canary_tenant:  # canaries belong to no job record
            return self.dispatch.withdraw_queued(ev.job_id, f"withdrawn: {ev.reason}", "canary_withdrawn", now)
        if job is None and self._wait_for_job(ev.job_id, ev, now):
            return []
        if job is None:
            return []  # unknown, another tenant's, or already finished: nothing changes
        out: list[Decision] = [changed(job, JobEventKind.CANCELLED, ev.reason)]
        out += self._closing(self.dispatch.fail_job(job.job_id, f"cancelled: {ev.reason}", "batch_cancelled", now))
        return out + self._forget_if_whole(job.job_id)

    def _expire(self, now: float) -> list[Decision]:
        out: list[Decision] = []
        for job in self.jobs.due_expiry(now):
            out.append(changed(job, JobEventKind.EXPIRED, job.reason))
            out += self._closing(self.dispatch.fail_job(job.job_id, f"expired: {job.reason}", "batch_expired", now))
        return out

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
        """A job whose output is whole is done with: its requests leave the state and the store,
        ``forget_per_step`` now and as many on each tick after (``_forget_some``). Until then a
        late event of one finds it finished, as it would find it gone."""
        job = self.jobs.jobs.get(job_id)
        if job is None or not job.state.is_finished or not output_whole(job):
            return []
        ids = self.dispatch.by_job.pop(job_id, set())
        if not ids:
            return []
        self._forgetting.append((job_id, sorted(ids, reverse=True)))
        return self._forget_some()

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
            return
        for rid in d.dirty:
            state = d.requests.get(rid)
            if state is None:
                store.requests.pop(rid, None)
            else:
                store.requests[rid] = state.to_record()
        for job_id in jobs.dirty:
            store.jobs[job_id] = jobs.jobs[job_id].to_record()
        for tenant, (counter, served) in d.tenants_changed(self._tenants_saved).items():
            store.tenants[tenant] = {"counter": counter, "served_cost": served}
        d.dirty.clear()
        jobs.dirty.clear()

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
            self.jobs.restore(JobRecord.from_record(record))
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
