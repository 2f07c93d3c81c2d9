"""What the clock finds at each tick: back-offs that are due, pools that died, stragglers.

- A request in BACKOFF whose ``retry_at`` has come goes back to its fair queue.
- A pool that says it is down, or whose last heartbeat is older than the timeout, is dead:
  ``policy.redispatch_lost`` decides which of the attempts on it are placed again (at once, away
  from the dead pools; a request with a live attempt elsewhere keeps that one).
- An attempt is looked at when it starts a phase and again when its profile says it may be late;
  ``policy.find_stragglers`` decides whether it gets a speculative copy on another pool.
Each touches only the requests concerned (heaps and the attempts-by-pool index), so a tick
costs the same with ten or a hundred thousand requests waiting.
"""

from __future__ import annotations

import heapq
from dataclasses import replace

from phaseroute.schemas.enums import Phase
from phaseroute.streams.policy import (
    InFlightAttempt,
    RunningAttempt,
    find_stragglers,
    redispatch_lost,
    straggler_limit_s,
)

from .decisions import Decision, Dispatch
from .dispatcher import Dispatcher
from .state import RequestState, RequestStatus


def requeue_due(d: Dispatcher, now: float) -> None:
    heap = d.backoff
    while heap and heap[0][0] <= now:
        at, _, rid = heapq.heappop(heap)
        state = d.requests.get(rid)
        if state is not None and state.status is RequestStatus.BACKOFF and state.retry_at == at:
            d.enqueue(state, now)


def redispatch_dead_pools(d: Dispatcher, now: float) -> None:
    dead = d.fleet.dead(now)
    touched: dict[str, RequestState] = {}
    for pool in dead:
        for rid, _ in d.on_pool.get(pool, ()):
            touched[rid] = d.requests[rid]
    if not touched:
        return
    in_flight = [InFlightAttempt(rid, a.phase, a.number, a.pool, s.next_attempt,
                                 frozenset({a.kv_at}) if a.kv_at else frozenset())
                 for rid, s in sorted(touched.items()) for a in s.attempts]
    redo = {r.request_id: r for r in redispatch_lost(in_flight, dead)}
    for rid, state in sorted(touched.items()):  # a set's order would make the re-queue order vary
        for attempt in [a for a in state.attempts if a.pool in dead]:
            d.detach(state, attempt)
        if rid in redo and state.status is RequestStatus.RUNNING:
            d.reports.redispatched += 1
            state.work = replace(state.work, avoid_pools=state.work.avoid_pools | redo[rid].avoid_pools)
            d.enqueue(state, now)  # the fair scheduler frees its old slot and keeps the charge


def _running(d: Dispatcher, state: RequestState) -> list[RunningAttempt]:
    out = []
    pools = {p.name: p for p in d.fleet.states()}
    for a in state.attempts:
        pool = pools.get(a.pool)
        batch = max(1, min(pool.in_flight, pool.max_batch)) if pool is not None else 1
        colocated_prefill = a.colocated and a.phase is Phase.PREFILL
        phase = Phase.DECODE if colocated_prefill else a.phase
        tokens = state.work.prompt_tokens if phase is Phase.PREFILL else state.work.max_output_tokens
        out.append(RunningAttempt(state.request_id, phase, a.number, a.pool, state.work.model, a.expected_start, tokens,
                                  batch, state.next_attempt, state.work.prompt_tokens if colocated_prefill else 0))
    return out


def speculate(d: Dispatcher, now: float) -> list[Decision]:
    """Pop the attempts due for a look; copy the stragglers, look again later at the others."""
    heap = d.stragglers
    out: list[Decision] = []
    recheck = d.config.straggler_recheck_s
    variants = {p.name: p.variant for p in d.fleet.states()}
    while heap and heap[0][0] <= now:
        _, _, rid, number, phase = heapq.heappop(heap)
        state = d.requests.get(rid)
        attempt = state.attempt(number) if state is not None else None
        if state is None or attempt is None or attempt.phase is not phase or state.status is not RequestStatus.RUNNING:
            continue
        if len(state.attempts) > d.config.retry.max_speculative_copies or state.pin is not None:
            continue  # it has its copy already, or it measures its own path (no copy elsewhere)
        running = _running(d, state)
        copies = find_stragglers(running, d.table, d.fleet.states(), now, d.config.retry)
        if copies:
            sent = d.dispatch(state, now, speculative=True, avoid=copies[0].avoid_pools)
            if isinstance(sent, Dispatch):
                out.append(sent)
                continue
            at = now + recheck  # no other pool can take the copy now
        else:
            mine = next(r for r in running if r.attempt == number)
            limit = straggler_limit_s(mine, d.table, variants.get(mine.pool, ""), now, d.config.retry)
            at = now + recheck if limit is None else max(mine.started_at + limit, now) + d.config.tick_s
        heapq.heappush(heap, (at, d._next_seq(), rid, number, phase))
    return out
