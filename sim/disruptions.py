"""Failures and fleet events: what the simulator does when instances die or pools change.

Random failures: each pool draws the next accelerator failure from its MTBF (exponential,
rate = alive accelerators / MTBF); the failing instance loses everything on it (running
prefills and decodes, KV held for transfers) and comes back empty after ``repair_s``. Fleet
events (from the fleet spec): ``slowdown`` (every step of the pool takes ``factor`` times
longer from then on), ``loss`` (the pool disappears: its instances die and its queues are
re-placed), ``restore``. Lost work goes back to the driver (``_lost``), which decides the
retry, exactly as the live tracker hands it to the policy's retry rules; a request the driver
gives up on fails its job (``_give_up``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from phaseroute.schemas.enums import JobState, Phase
from phaseroute.sim.events import CANCELLED, DECODE, DEFERRED, FAIL, GAVE_UP, LOST, QUEUED_DECODE, REPAIR, RETRY, TRANSFER
from phaseroute.sim.instance import Instance

if TYPE_CHECKING:
    from phaseroute.sim.engine import PoolRun
    from phaseroute.sim.fleet import FleetEvent
    from phaseroute.sim.host import SimHost


class Disruptions:
    """Mixin of ``Simulator``: failure, repair and fleet-event handlers; lost and failed requests."""

    def _kill(self: SimHost, inst: Instance, cause: str) -> None:
        pool = self.pools[inst.pool]
        inst.advance(self.now, self.tel)
        lost = inst.requests()
        pool.running -= len(inst.dec_heap) + len(inst.pre_q)
        inst.alive = False
        pool.n_alive -= 1
        inst.reset(self.now)
        for rid in lost:
            self._lost(rid, pool.idx, cause)

    def _next_failure(self: SimHost, pool: PoolRun, now: float) -> None:
        rate = pool.alive_instances * pool.spec.perf.tp / (pool.spec.mtbf_hours * 3600.0)
        if rate > 0:
            self.push(now + self.rng.expovariate(rate), FAIL, pool)

    def _on_fail(self: SimHost, pool: PoolRun, _b: object) -> None:
        alive = [i for i in pool.instances if i.alive]
        if not pool.alive or not alive:
            return
        inst = alive[self.rng.randrange(len(alive))]
        pool.failures += 1
        pool.failure_times.append(self.now)
        self._kill(inst, "worker_death")
        self.push(self.now + pool.spec.repair_s, REPAIR, inst)
        self._next_failure(pool, self.now)

    def _on_repair(self: SimHost, inst: Instance, _b: object) -> None:
        pool = self.pools[inst.pool]
        if not pool.alive or inst.alive:
            return
        self._revive(pool, inst)
        self._dispatch(pool)

    def _revive(self: SimHost, pool: PoolRun, inst: Instance) -> None:
        inst.alive = True
        pool.n_alive += 1
        inst.slowdown = pool.slowdown
        inst.reset(self.now)
        inst.hungry = True
        pool.hungry.append(inst)

    def _on_fleet(self: SimHost, event: FleetEvent, _b: object) -> None:
        for name in self.fleet.parents[event.pool]:
            pool = next(p for p in self.pools if p.spec.name == name)
            if event.kind == "slowdown":
                pool.slowdown = event.factor
                for inst in pool.instances:
                    if inst.alive:
                        inst.advance(self.now, self.tel)
                        inst.slowdown = event.factor
                        self._schedule(inst)
            elif event.kind == "loss":
                self._lose_pool(pool)
            elif event.kind == "restore":
                pool.alive, pool.slowdown = True, 1.0
                self.pool_end_t[pool.idx] = math.nan
                for inst in pool.instances:
                    if not inst.alive:
                        self._revive(pool, inst)
                    else:
                        inst.advance(self.now, self.tel)
                        inst.slowdown = 1.0
                        self._schedule(inst)
                self._dispatch(pool)

    def _lose_pool(self: SimHost, pool: PoolRun) -> None:
        pool.alive = False
        self.pool_end_t[pool.idx] = self.now
        for inst in pool.instances:
            if inst.alive:
                self._kill(inst, "pool_lost")
        queued = list(pool.q_pre) + list(pool.q_dec)
        pool.q_pre.clear()
        pool.q_dec.clear()
        pool.q_pre_tokens = pool.q_dec_tokens = 0
        pool.hungry.clear()
        for rid in queued:
            self._lost(rid, pool.idx, "pool_lost")

    # ------------------------------------------------------------------ lost and failed requests
    def _lost(self: SimHost, rid: int, pool_idx: int, cause: str) -> None:
        """A request's attempt is gone: ``cause`` is worker_death, pool_lost or refused (the pool
        was dead or too small when the request reached it). The driver decides what follows."""
        if rid in self.twin:                   # its twin still runs and will finish the request
            del self.twin[self.twin.pop(rid)]
            self.attempt[rid] += 1
            self.status[rid] = CANCELLED
            self.where[rid] = None
            self.counters["requests_lost"] += 1
            self.driver.on_cancel(rid, self.now)
            return
        phase = Phase.DECODE if self.status[rid] in (TRANSFER, QUEUED_DECODE, DECODE) else Phase.PREFILL
        self.lost_from = self.status[rid]
        self.attempt[rid] += 1
        self.status[rid] = LOST
        self.where[rid] = None
        self.counters["requests_lost"] += 1
        decision = self.driver.on_lost(rid, pool_idx, self.now, cause, phase)
        if decision is DEFERRED:
            return
        if decision is None:
            self.inflight -= 1
            self.inflight_tokens -= self.prompt[rid] + self.output[rid]
            self._give_up(rid, f"request {rid} gave up after {self.attempt[rid]} attempts")
            return
        self.counters["retries"] += 1
        self.push(max(decision, self.now), RETRY, rid, self.attempt[rid])

    def _give_up(self: SimHost, rid: int, why: str) -> None:
        """The request fails for good (its in-flight slot already given back); so does its job."""
        self.status[rid] = GAVE_UP
        self.counters["gave_up"] += 1
        self.unplaced.pop(rid, None)
        self.unplaced_since.pop(rid, None)
        j = self.job[rid]
        if self.job_state[j] is JobState.ADMITTED:
            self.job_state[j] = JobState.FAILED
            self.job_reason[j] = why
            self.unresolved_jobs -= 1
