"""Dispatch: the request-keyed half of the control core (fair release, routing, attempts).

Life of a request here (statuses in ``state.py``):
1. ``queue``: an admitted request enters its tenant's fair queue (QUEUED).
2. ``release`` (every tick): the fair scheduler releases work up to the fleet's free slots
   (``FleetState.free_slots``, the backpressure rule); the router places each release on a path
   from the measured profile table and a ``Dispatch`` goes out (RUNNING). A release no pool can
   place gives its slot and charge back and waits (BACKOFF, doubling) until
   ``policy.give_up_unplaced`` ends a wait that outlived its deadline.
3. ``kv_ready`` moves the attempt to its decode pool; ``result`` ends the request (the first
   result wins; every other attempt's result is ignored).
4. ``attempt_failed``: ``policy.next_step`` retries it after a back-off away from the pools that
   failed it (BACKOFF, then QUEUED), or gives up: FAILING, with a ``FailRequest``.
``recovery.py`` adds what the clock finds: due back-offs, pools that died (their attempts are
placed again at once), stragglers (a speculative copy). Indexes keep a tick's cost independent
of how many requests wait: the fair queues, a back-off heap, attempts by pool, a straggler heap.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field, replace

from phaseroute.schemas.enums import Phase
from phaseroute.streams.policy import (
    AttemptRecord,
    AttemptStatus,
    FailureKind,
    FairScheduler,
    FreeCapacity,
    GiveUp,
    NoPlacement,
    ProfileTable,
    RequestWork,
    RouterState,
    give_up_unplaced,
    next_step,
    route,
)

from .config import CoreConfig
from .decisions import Decision, Dispatch, FailRequest, Problem
from .events import AttemptFailed, KvReady, RequestQueued, ResultReceived
from .fleet import FleetState
from .state import Attempt, PastAttempt, RequestState, RequestStatus


@dataclass
class Reports:
    """Counters for the demo summary, `phaseroute status` and the simulator's metrics."""

    colocated: int = 0
    disaggregated: int = 0
    explored: int = 0
    retries: int = 0
    speculative: int = 0
    redispatched: int = 0
    unplaced: int = 0
    by_pool: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Closed:
    """A request's first result was read: the job counts it (``ok``); ``was_open``: it had not
    been failing, so the job's backlog still held it."""

    job_id: str
    ok: bool
    was_open: bool
    prompt_tokens: int
    max_tokens: int
    tenant: str = ""


class Dispatcher:
    def __init__(self, config: CoreConfig, rng: random.Random) -> None:
        self.config = config
        self.rng = rng
        self.requests: dict[str, RequestState] = {}
        self.by_job: dict[str, set[str]] = {}
        self.fair = FairScheduler(config.fair_with_canaries())
        self.router_state = RouterState()
        self.fleet = FleetState(config.failure_window_s, config.heartbeat_timeout_s, config.kv_in_flight_factor)
        self.table = ProfileTable()
        self.fleet_cost_per_s: float | None = None
        self.reports = Reports()
        self.dirty: set[str] = set()  # requests whose persisted record changed
        self.on_pool: dict[str, set[tuple[str, int]]] = {}  # pool -> (request, attempt) live there
        self.backoff: list[tuple[float, int, str]] = []  # (retry_at, seq, request)
        self.stragglers: list[tuple[float, int, str, int, Phase]] = []  # (check at, seq, request, attempt, phase)
        self._seq = 0
        self.released: dict[str, int] = {}
        self.capped = False  # the last release stopped at max_releases_per_tick...
        self._budget = 0  # ...with this many of its tick's free slots left to release
        # a speculative copy goes to another pool or nowhere (never back where the request runs)
        self._copy_router = replace(config.router, relax_avoid_when_empty=False)
        self.route = route  # the policy's router (a field: ``sim/tick_bench`` times its calls)

    # -- helpers -------------------------------------------------------------------------------
    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def add(self, state: RequestState) -> None:
        self.requests[state.request_id] = state
        self.by_job.setdefault(state.job_id, set()).add(state.request_id)
        self.dirty.add(state.request_id)

    def forget(self, request_id: str) -> None:
        state = self.requests.pop(request_id, None)
        if state is not None:
            ids = self.by_job.get(state.job_id)
            if ids is not None:
                ids.discard(request_id)
                if not ids:
                    del self.by_job[state.job_id]
            self.dirty.add(request_id)

    def enqueue(self, state: RequestState, now: float) -> None:
        state.status = RequestStatus.QUEUED
        state.retry_at = None
        self.fair.enqueue(state.work, now)
        self.dirty.add(state.request_id)

    def _backoff_until(self, state: RequestState, at: float) -> None:
        state.status = RequestStatus.BACKOFF
        state.retry_at = at
        heapq.heappush(self.backoff, (at, self._next_seq(), state.request_id))
        self.dirty.add(state.request_id)

    def _attach(self, state: RequestState, attempt: Attempt) -> None:
        state.attempts.append(attempt)
        self.fleet.add_in_flight(attempt.pool, 1, state.work.total_tokens)
        self.on_pool.setdefault(attempt.pool, set()).add((state.request_id, attempt.number))

    def detach(self, state: RequestState, attempt: Attempt) -> None:
        state.attempts.remove(attempt)
        self.fleet.add_in_flight(attempt.pool, -1, state.work.total_tokens)
        self.on_pool.get(attempt.pool, set()).discard((state.request_id, attempt.number))
        self.dirty.add(state.request_id)

    # -- events --------------------------------------------------------------------------------
    def queue(self, ev: RequestQueued, now: float, job_open: bool) -> list[Decision]:
        """An admitted request arrives for dispatch; one of a job already cancelled or expired
        ends at once (it was admitted, so it needs its one final line)."""
        if ev.request_id in self.requests:
            return []  # a replay of requests.pending
        work = RequestWork(ev.request_id, ev.job_id, ev.tenant, ev.model, ev.prompt_tokens, ev.max_tokens,
                           ev.deadline, ev.quality_tier, ev.quality_tolerance)
        state = RequestState(work, ev.custom_id, ev.priority, pin=ev.pin)
        self.add(state)
        if not job_open:
            return self.fail(state, "its job was cancelled or expired before it was dispatched", "batch_cancelled",
                             now)
        self.enqueue(state, now)
        return []

    def kv_ready(self, ev: KvReady, now: float) -> None:
        state = self.requests.get(ev.request_id)
        attempt = state.attempt(ev.attempt_number) if state is not None else None
        if state is None or attempt is None or attempt.phase is not Phase.PREFILL or attempt.colocated:
            return  # a replay, a superseded attempt, or a request already ended
        self.fleet.add_in_flight(attempt.prefill_pool, -1, state.work.total_tokens)
        self.on_pool.get(attempt.prefill_pool, set()).discard((state.request_id, attempt.number))
        attempt.phase, attempt.started_at, attempt.kv_at, attempt.wait_s = Phase.DECODE, now, ev.kv_at, attempt.decode_wait_s
        self.fleet.add_in_flight(attempt.decode_pool, 1, state.work.total_tokens)
        self.on_pool.setdefault(attempt.decode_pool, set()).add((state.request_id, attempt.number))
        self.watch(state, attempt, now)
        self.dirty.add(state.request_id)

    def result(self, ev: ResultReceived, now: float) -> Closed | None:
        """The request's first result ends it; None for any later one (a copy, a replay)."""
        state = self.requests.get(ev.request_id)
        if state is None or state.status.is_finished:
            return None
        was_open = state.status.is_open
        for attempt in list(state.attempts):
            self.detach(state, attempt)
        self.fair.on_finished(state.request_id, now, ev.completion_tokens if ev.ok else 0)
        state.status = RequestStatus.DONE if ev.ok else RequestStatus.FAILED
        state.retry_at = None
        self.dirty.add(state.request_id)
        return Closed(state.job_id, ev.ok, was_open, state.work.prompt_tokens, state.work.max_output_tokens,
                      state.work.tenant)

    def attempt_failed(self, ev: AttemptFailed, now: float) -> list[Decision]:
        state = self.requests.get(ev.request_id)
        attempt = state.attempt(ev.attempt_number) if state is not None else None
        if state is None or attempt is None or state.status is not RequestStatus.RUNNING:
            return []  # a replay, or an attempt that no longer counts
        self.detach(state, attempt)
        self.fleet.record_failure(ev.pool, now)
        kv_lost = ev.kind is FailureKind.KV_CHECKSUM or (attempt.phase is Phase.DECODE and attempt.kv_at == attempt.pool)
        state.failures.append(PastAttempt(attempt.number, attempt.phase, ev.pool, attempt.started_at, now,
                                          ev.kind.value, ev.detail[:300], kv_lost))
        if state.attempts:
            return []  # its other attempt (a speculative copy) goes on
        return self.retry_or_give_up(state, now)

    def retry_or_give_up(self, state: RequestState, now: float) -> list[Decision]:
        history = [AttemptRecord(state.request_id, f.phase, f.number, f.pool, AttemptStatus.FAILED, f.started_at,
                                 f.ended_at, FailureKind(f.failure), f.detail, f.kv_lost) for f in state.failures]
        step = next_step(history, now, self.config.retry, self.rng)
        if isinstance(step, GiveUp):
            return self.fail(state, step.reason, "request_failed", now)
        self.reports.retries += 1
        state.work = replace(state.work, avoid_pools=step.avoid_pools)
        self._backoff_until(state, step.at)
        return []

    def fail(self, state: RequestState, reason: str, code: str, now: float) -> list[Decision]:
        """The request ends with a failure: its final failed result is sent (FAILING until read)."""
        if not state.status.is_open:
            return []
        self.fair.on_finished(state.request_id, now, 0)
        state.status = RequestStatus.FAILING
        state.retry_at = None
        state.final_reason, state.final_code = reason, code
        self.dirty.add(state.request_id)
        return [FailRequest(state.work, state.custom_id, state.next_attempt, reason, code)]

    def fail_job(self, job_id: str, reason: str, code: str, now: float) -> list[Decision]:
        """Every open request of the job fails (cancelled or expired); queued ones leave the fair queue."""
        self.fair.cancel_job(job_id)
        out: list[Decision] = []
        for rid in sorted(self.by_job.get(job_id, ())):
            out += self.fail(self.requests[rid], reason, code, now)
        return out

    def withdraw_queued(self, job_id: str, reason: str, code: str, now: float) -> list[Decision]:
        """The job's requests still in the fair queue leave it and fail; released ones run on
        (how a closed drift round's late canaries are withdrawn)."""
        out: list[Decision] = []
        for work in self.fair.cancel_job(job_id):
            state = self.requests.get(work.request_id)
            if state is not None:
                out += self.fail(state, reason, code, now)
        return out

    # -- release and placement -----------------------------------------------------------------
    def release(self, now: float) -> list[Decision]:
        """The fair scheduler releases up to the free slots, at most ``max_releases_per_tick``
        (``capped``: it stopped there, more may go at once); the router places each release.
        A tick after a capped one goes on with what is left of the capped tick's budget (the
        free slots it started with), so the slices together release at most what one unbounded
        tick would: a release that no pool can place still takes its share of the budget."""
        free = self.fleet.free_slots(now, self.config.slots_per_worker)
        self.released = {}  # tenant -> requests the fair scheduler released this tick (also those given back)
        budget = min(self._budget, free) if self.capped else free
        self.capped = False
        if budget <= 0:
            return []
        out: list[Decision] = []
        take = min(budget, self.config.max_releases_per_tick)
        releases = self.fair.schedule(FreeCapacity(take), now, self.fleet_cost_per_s).releases
        self._budget = budget - len(releases)
        self.capped = len(releases) >= take and self._budget > 0
        for release in releases:
            tenant = release.request.tenant
            self.released[tenant] = self.released.get(tenant, 0) + 1
            state = self.requests.get(release.request.request_id)
            if state is None or state.status is not RequestStatus.QUEUED:
                self.fair.unrelease(release.request.request_id)  # it ended while it waited
                continue
            try:
                out += self.place(state, now)
            except Exception as exc:  # one request's bad data must not stop the tick
                out += self.internal_error(state, f"placing it raised {type(exc).__name__}: {exc}", now)
        return out

    def place(self, state: RequestState, now: float) -> list[Decision]:
        if state.pin is not None:
            return self._place_pinned(state, state.pin, now)
        sent = self.dispatch(state, now, speculative=False)
        if isinstance(sent, Dispatch):
            state.unplaced_since, state.unplaced_tries = None, 0
            return [sent]
        return self._unplaced(state, sent, now)

    def dispatch(self, state: RequestState, now: float, speculative: bool,
                 avoid: frozenset[str] = frozenset()) -> Dispatch | NoPlacement:
        work = state.work if not avoid else replace(state.work, avoid_pools=state.work.avoid_pools | avoid)
        router = self._copy_router if speculative else self.config.router
        decision = self.route(work, self.fleet.states(), self.table, self.router_state, router, now, self.rng)
        if isinstance(decision, NoPlacement):
            return decision
        self.router_state.record(decision, work, now, self.config.router)
        estimate = decision.estimate
        wait = estimate.prefill_wait_s + (estimate.decode_wait_s if decision.colocated else 0.0)
        attempt = Attempt(state.next_attempt, decision.prefill_pool, decision.decode_pool, decision.colocated,
                          Phase.PREFILL, now, speculative, None, wait, estimate.decode_wait_s)
        state.next_attempt += 1
        state.status = RequestStatus.RUNNING
        self._attach(state, attempt)
        self.watch(state, attempt, now)
        self.dirty.add(state.request_id)
        r = self.reports
        r.colocated += decision.colocated
        r.disaggregated += not decision.colocated
        r.explored += decision.explored
        r.speculative += speculative
        for pool in {decision.prefill_pool, decision.decode_pool}:
            r.by_pool[pool] = r.by_pool.get(pool, 0) + 1
        return Dispatch(state.work, state.custom_id, state.priority, attempt.number, decision.prefill_pool,
                        decision.decode_pool, decision.colocated, speculative, decision.explored)

    def _place_pinned(self, state: RequestState, pin: tuple[str, str], now: float) -> list[Decision]:
        """A request that measures one path (a drift canary) runs there or nowhere: a path whose
        pools are not alive, or do not serve its phases, fails it at once."""
        prefill, decode = pin
        pools = {p.name: p for p in self.fleet.states()}
        dead = self.fleet.dead(now)
        a, b = pools.get(prefill), pools.get(decode)
        if a is None or b is None or prefill in dead or decode in dead or not a.serves(Phase.PREFILL) \
                or not b.serves(Phase.DECODE):
            self.fair.unrelease(state.request_id)
            return self.fail(state, f"its path {prefill} -> {decode} is not alive", "path_gone", now)
        attempt = Attempt(state.next_attempt, prefill, decode, prefill == decode, Phase.PREFILL, now)
        state.next_attempt += 1
        state.status = RequestStatus.RUNNING
        self._attach(state, attempt)
        self.dirty.add(state.request_id)
        return [Dispatch(state.work, state.custom_id, state.priority, attempt.number, prefill, decode,
                         attempt.colocated, False, False)]

    def _unplaced(self, state: RequestState, refusal: NoPlacement, now: float) -> list[Decision]:
        """No pool can take it now: slot and charge back, wait (doubling), until the wait
        outlived ``unplaced_give_up_s`` and the deadline; then it fails with the router's reasons."""
        self.fair.unrelease(state.request_id)
        self.reports.unplaced += 1
        if state.unplaced_since is None:
            state.unplaced_since = now
        state.unplaced_tries += 1
        why = refusal.explain()
        give_up = give_up_unplaced(state.request_id, state.work.deadline, state.unplaced_since, now, why,
                                   self.config.retry)
        if give_up is not None:
            return self.fail(state, give_up.reason, "no_placement", now)
        self._backoff_until(state, now + self.config.unplaced_backoff(state.unplaced_tries))
        return []

    def internal_error(self, state: RequestState, detail: str, now: float) -> list[Decision]:
        """A bug met while handling this request: it counts as a failed attempt on no pool, so
        it is retried and, if the bug stays, fails with the reason in its result."""
        self.fair.unrelease(state.request_id)
        state.failures.append(PastAttempt(state.next_attempt, Phase.PREFILL, "control-plane", now, now,
                                          FailureKind.ERROR.value, detail[:300], False))
        state.next_attempt += 1
        problem = Problem(f"request {state.request_id}", detail)
        if state.attempts or not state.status.is_open:
            return [problem]
        return [problem, *self.retry_or_give_up(state, now)]

    # -- persistence of the fair scheduler ----------------------------------------------------
    def tenants_changed(self, saved: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        """Tenants whose VTC state differs from ``saved`` (updated in place)."""
        changed = {}
        for tenant, value in self.fair.state().items():
            if saved.get(tenant) != value:
                changed[tenant] = saved[tenant] = value
        return changed

    def watch(self, state: RequestState, attempt: Attempt, now: float) -> None:
        """Look at the attempt when it may first be a straggler (``recovery.speculate``): no
        attempt is one before its expected start + the straggler grace."""
        at = attempt.expected_start + self.config.retry.straggler_grace_s
        heapq.heappush(self.stragglers, (at, self._next_seq(), state.request_id, attempt.number, attempt.phase))
