"""The discrete-event fleet simulator.

A request's life (``status`` values, in order)::

    NEW -> (job admitted, released by the driver's scheduler, routed)
    QUEUED_PREFILL at its prefill pool -> PREFILL on an instance
        -> colocated: DECODE on the same instance -> DONE
        -> else: TRANSFER over the pool-to-pool link -> QUEUED_DECODE at the decode pool
           -> DECODE on an instance -> DONE
    any live state -> LOST (instance failure, pool loss) -> retried (NEW route) or GAVE_UP

Events: job arrivals, instance wake-ups (next prefill or decode completion, see instance.py),
transfer completions, scheduler releases, profile refreshes (telemetry -> driver), samples for
the time series, fleet events (slowdown, loss, restore), random failures and repairs. Ties
break by insertion order, and all randomness comes from ``SimConfig.seed``: same inputs, same
result. Decisions (admission, release order, routing, retries) belong to a ``Driver``: a
baseline (drivers.py) answers the engine's questions (release, route, retry); phaseroute's
driver (core_driver.py) runs the live control core on its own TICK events and places work with
``place``, as the data plane executes the control plane's sends. The engine only executes.
This module holds the event loop, release, routing and the instances' scheduling; the other
handlers are mixins: ``phase_ends`` (a prefill, transfer or decode finished), ``disruptions``
(failures, fleet events, lost and failed requests), ``speculation`` and ``sampling``.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from phaseroute.schemas.enums import JobState
from phaseroute.sim.collector import paced_for_long_runs
from phaseroute.sim.disruptions import Disruptions
from phaseroute.sim.events import (  # noqa: F401  (the statuses are re-exported for drivers and tests)
    ARRIVE,
    CANCELLED,
    DECODE,
    DEFERRED,
    DONE,
    FLEET,
    GAVE_UP,
    LOST,
    NEW,
    PREFILL,
    QUEUED_DECODE,
    QUEUED_PREFILL,
    REFRESH,
    RELEASE,
    RETRY,
    SAMPLE,
    TICK,
    TRANSFER,
    WAKE,
    XFER,
)
from phaseroute.sim.fleet import Fleet, SimPool
from phaseroute.sim.instance import Instance
from phaseroute.sim.phase_ends import PhaseEnds
from phaseroute.sim.sampling import Sampling
from phaseroute.sim.speculation import Speculation
from phaseroute.sim.telemetry import Telemetry
from phaseroute.sim.workload import Workload


@dataclass(frozen=True)
class SimConfig:
    seed: int = 0
    refresh_s: float = 30.0            # profile refresh period (telemetry -> profile rows)
    half_life_s: float = 60.0          # decay of telemetry in the aggregates
    release_interval_s: float = 0.25   # scheduler releases at most this often
    inflight_per_instance: int = 64    # backpressure: released, unfinished requests per instance...
    inflight_kv_factor: float = 1.5    # ...and their tokens <= this x the KV tokens the alive instances hold
    sample_s: float = 0.0              # time-series period (0: 1/100 of the arrival window)
    failures: bool | None = None       # None: as the fleet spec says
    retry_delay_s: float = 1.0         # wait before re-routing a request no pool accepted...
    max_retry_delay_s: float = 5.0     # ...doubling per refusal up to this
    end_after_deadline: float = 1.0    # stop at last deadline + this x (last deadline - first submit)


def backoff(tries: int, base: float, cap: float) -> float:
    """Delay before routing again a request refused ``tries`` times: doubling from ``base`` up to ``cap``."""
    return min(base * 2.0 ** min(tries - 1, 60), cap)


class PoolRun:
    """Run-time state of one pool: its instances and its two queues (prefill, decode)."""

    def __init__(self, idx: int, spec: SimPool, chunk_alone: int, chunk_mixed: int):
        self.idx = idx
        self.spec = spec
        self.alive = True
        self.slowdown = 1.0
        self.instances = [Instance(idx, k, spec.perf, chunk_alone, chunk_mixed) for k in range(spec.instances)]
        self.q_pre: deque[int] = deque()
        self.q_dec: deque[int] = deque()
        self.q_pre_tokens = 0
        self.q_dec_tokens = 0
        self.running = 0
        self.hungry: deque[Instance] = deque(self.instances)
        for inst in self.instances:
            inst.hungry = True
        self.kvpt = spec.perf.kv_per_token
        self.failures = 0
        self.failure_times: list[float] = []
        self.routed_pre = 0            # prompt tokens placed here for prefill since the last sample
        self.routed_dec = 0            # output tokens placed here for decode since the last sample
        self.busy_mark = 0.0
        self.n_alive = len(self.instances)

    @property
    def alive_instances(self) -> int:
        return self.n_alive if self.alive else 0


class Simulator(Disruptions, PhaseEnds, Sampling, Speculation):
    def __init__(self, workload: Workload, fleet: Fleet, driver: Any, config: SimConfig = SimConfig()):
        self.w, self.fleet, self.driver, self.cfg = workload, fleet, driver, config
        n = workload.n_requests
        self.prompt: list[int] = workload.req_prompt.tolist()
        self.output: list[int] = workload.req_output.tolist()
        self.job: list[int] = workload.req_job.tolist()
        self.ctx: list[float] = (workload.req_prompt + workload.req_output / 2.0).tolist()
        self.status = [NEW] * n
        self.attempt = [0] * n
        self.pre_pool = [-1] * n
        self.dec_pool = [-1] * n
        self.colo = [False] * n
        self.where: list[Instance | None] = [None] * n
        self.t_done = [math.nan] * n
        self.t_phase = [0.0] * n                 # when the current phase started on an instance
        self.twin: dict[int, int] = {}           # request <-> its speculative copy
        self.job_left = workload.job_count.tolist()
        self.job_done_t = [math.nan] * workload.n_jobs
        # SUBMITTED until the job arrives; then REJECTED or ADMITTED; an admitted job ends COMPLETED or FAILED
        self.job_state = [JobState.SUBMITTED] * workload.n_jobs
        self.job_reason: list[str] = [""] * workload.n_jobs
        self.pools = [PoolRun(i, p, fleet.limits.prefill_chunk, fleet.limits.mixed_chunk) for i, p in enumerate(fleet.pools)]
        self.links_busy: dict[tuple[str, str], float] = {}
        self.unplaced: dict[int, int] = {}    # request -> consecutive routing refusals
        self.unplaced_since: dict[int, float] = {}  # request -> when the first of those refusals came
        self.tel = Telemetry(len(self.pools))
        self.rng = random.Random(config.seed)
        self.heap: list[tuple[float, int, int, Any, Any]] = []   # (time, seq, kind, a, b)
        self.seq = 0
        self.now = 0.0
        self.inflight = 0
        self.inflight_tokens = 0
        self.mean_tokens = float((workload.req_prompt + workload.req_output).mean()) if n else 1.0
        self.release_pending = False
        self.unresolved_jobs = workload.n_jobs
        self.counters = {"retries": 0, "gave_up": 0, "no_placement": 0, "kv_bytes": 0.0, "transfers": 0,
                         "requests_lost": 0, "speculated": 0, "speculation_wins": 0, "events": 0}
        self.series: list[dict[str, Any]] = []
        self.last_deadline = float(workload.job_deadline.max()) if workload.n_jobs else 0.0
        first = float(workload.job_submit.min()) if workload.n_jobs else 0.0
        self.t_end = self.last_deadline + config.end_after_deadline * (self.last_deadline - first)
        self.sample_s = config.sample_s or max(workload.span_s / 100.0, 1.0)
        self.last_sample = 0.0
        self.last_sample_tokens = 0.0
        self.tokens_done = 0.0
        self.pool_end_t = [math.nan] * len(self.pools)   # when a pool stopped billing (loss)
        n_t = len(workload.tenants)
        self.req_tenant: list[int] = workload.job_tenant[workload.req_job].tolist()
        self.tenant_waiting = [0] * n_t       # admitted, not yet released requests
        self.tenant_released = [0.0] * n_t    # tokens released (cumulative)
        self.tenant_mark = [0.0] * n_t
        self.lost_from = NEW                  # status of the request being lost, while the driver hears of it
        self.self_released = bool(getattr(driver, "self_released", False))  # the driver releases on its own ticks
        driver.attach(self)

    # ------------------------------------------------------------------ event plumbing
    def push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def run(self) -> Simulator:
        w = self.w
        for j in range(w.n_jobs):
            self.push(float(w.job_submit[j]), ARRIVE, j)
        for e in self.fleet.events:
            self.push(e.at_s, FLEET, e)
        self.push(self.cfg.refresh_s, REFRESH)
        self.push(self.sample_s, SAMPLE)
        if self.cfg.failures if self.cfg.failures is not None else self.fleet.failures:
            for p in self.pools:
                self._next_failure(p, 0.0)
        handlers = (self._on_arrive, self._on_wake, self._on_xfer, self._on_release, self._on_refresh,
                    self._on_sample, self._on_fleet, self._on_fail, self._on_repair, self._on_retry, self._on_tick)
        heap, pop = self.heap, heapq.heappop
        events = 0
        with paced_for_long_runs():
            while heap and self.unresolved_jobs > 0:
                t, _, kind, a, b = pop(heap)
                if t > self.t_end:
                    break
                self.now = t
                events += 1
                handlers[kind](a, b)
        self.counters["events"] = events
        self._on_sample(None, None)
        return self

    # ------------------------------------------------------------------ jobs and release
    def _on_arrive(self, j: int, _b: object) -> None:
        reason = self.driver.submit(j, self.now)
        if reason is not None:
            self.job_state[j] = JobState.REJECTED
            self.job_reason[j] = reason
            self.unresolved_jobs -= 1
            return
        self.job_state[j] = JobState.ADMITTED
        self.tenant_waiting[int(self.w.job_tenant[j])] += int(self.w.job_count[j])
        self._want_release()

    def _on_tick(self, _a: object, _b: object) -> None:
        self.driver.on_tick(self.now)

    def _want_release(self) -> None:
        if self.self_released:
            return
        if not self.release_pending:
            self.release_pending = True
            self.push(self.now, RELEASE)

    def capacity_target(self) -> int:
        return sum(p.alive_instances for p in self.pools) * self.cfg.inflight_per_instance

    def free_capacity(self) -> int:
        """Requests the fleet can take now: within the request cap and the KV-token cap (converted
        to requests at the workload's mean size)."""
        kv_tokens = sum(p.alive_instances * p.spec.perf.max_tokens_in_kv() for p in self.pools)
        by_tokens = (self.cfg.inflight_kv_factor * kv_tokens - self.inflight_tokens) / self.mean_tokens
        return int(min(self.capacity_target() - self.inflight, by_tokens))

    def _on_release(self, _a: object, _b: object) -> None:
        self.release_pending = False
        if self.self_released:
            return
        free = self.free_capacity()
        if free <= 0 or not self.driver.backlog():
            return
        tenant, waiting, released = self.req_tenant, self.tenant_waiting, self.tenant_released
        for rid in self.driver.release(free, self.now):
            self.inflight += 1
            self.inflight_tokens += self.prompt[rid] + self.output[rid]
            t = tenant[rid]
            waiting[t] -= 1
            released[t] += self.prompt[rid] + self.output[rid]
            self._route(rid)
        if self.driver.backlog() and self.free_capacity() > 0:
            self.release_pending = True
            self.push(self.now + self.cfg.release_interval_s, RELEASE)

    def _route(self, rid: int) -> None:
        """Ask a baseline driver where the request goes, and place it (or retry later)."""
        choice = self.driver.route(rid, self.now)
        tokens = self.prompt[rid] + self.output[rid]
        if choice is None:
            self.counters["no_placement"] += 1
            self.status[rid] = LOST
            if rid not in self.unplaced:
                # As the live control plane does: a request no pool can take now gives back its
                # in-flight slot (other work is released in its place) and is tried again later.
                self.inflight -= 1
                self.inflight_tokens -= tokens
                self._want_release()
            tries = self.unplaced[rid] = self.unplaced.get(rid, 0) + 1
            since = self.unplaced_since.setdefault(rid, self.now)
            if self.driver.give_up_unplaced(rid, since, self.now):
                self._give_up(rid, f"request {rid} had no placement for {self.now - since:.0f} s")
                return
            self.push(self.now + backoff(tries, self.cfg.retry_delay_s, self.cfg.max_retry_delay_s), RETRY, rid,
                      self.attempt[rid])
            return
        self.unplaced_since.pop(rid, None)
        if self.unplaced.pop(rid, None) is not None:   # placed at last: it holds a slot again
            self.inflight += 1
            self.inflight_tokens += tokens
        self.place(rid, *choice)

    def place(self, rid: int, a: int, b: int) -> None:
        """Queue the request for prefill on pool ``a`` (decode on ``b``; colocated when equal). A
        pool that is gone, or has no instance that could hold the request's KV, refuses it."""
        self.pre_pool[rid], self.dec_pool[rid] = a, b
        self.colo[rid] = a == b
        pool, dst = self.pools[a], self.pools[b]
        need = pool.kvpt * (self.prompt[rid] + (self.output[rid] if a == b else 0))
        if not pool.alive or need > pool.spec.perf.kv_capacity:
            self._lost(rid, a, "refused")     # no instance of the pool could ever hold it
            return
        if a != b and (not dst.alive or dst.kvpt * (self.prompt[rid] + self.output[rid]) > dst.spec.perf.kv_capacity):
            self._lost(rid, b, "refused")
            return
        pool.routed_pre += self.prompt[rid]
        self.pools[b].routed_dec += self.output[rid]
        self.status[rid] = QUEUED_PREFILL
        pool.q_pre.append(rid)
        pool.q_pre_tokens += self.prompt[rid]
        self._dispatch(pool)

    def _on_retry(self, rid: int, attempt: int) -> None:
        if self.attempt[rid] == attempt and self.status[rid] == LOST:
            self._route(rid)

    # ------------------------------------------------------------------ instances
    def _schedule(self, inst: Instance) -> None:
        nxt = inst.retune(self.prompt)
        inst.version += 1
        if nxt != math.inf:
            self.seq += 1
            heapq.heappush(self.heap, (self.now + nxt, self.seq, WAKE, inst, inst.version))

    def _dispatch(self, pool: PoolRun) -> None:
        hungry = pool.hungry
        now, tel = self.now, self.tel
        while hungry and (pool.q_pre or pool.q_dec):
            inst = hungry.popleft()
            inst.hungry = False
            if not inst.alive:
                continue
            inst.advance(now, tel)
            if self._fill(pool, inst):
                self._schedule(inst)

    def _fill(self, pool: PoolRun, inst: Instance) -> int:
        """Pull work from the pool's queues while the instance has room; FIFO, decode first."""
        took = 0
        kvpt, prompt, output, status, where = pool.kvpt, self.prompt, self.output, self.status, self.where
        q = pool.q_dec
        while q:
            rid = q[0]
            need = kvpt * (prompt[rid] + output[rid])
            if not inst.room_decode(need):
                break
            q.popleft()
            pool.q_dec_tokens -= output[rid]
            inst.take_decode(rid, output[rid], self.ctx[rid], need)
            status[rid] = DECODE
            where[rid] = inst
            self.t_phase[rid] = self.now
            took += 1
        blocked = bool(q)
        q = pool.q_pre
        colo = self.colo
        while q:
            rid = q[0]
            c = colo[rid]
            need = kvpt * (prompt[rid] + (output[rid] if c else 0))
            if not inst.room_prefill(need, c):
                break
            q.popleft()
            pool.q_pre_tokens -= prompt[rid]
            inst.take_prefill(rid, prompt[rid], need, c)
            status[rid] = PREFILL
            where[rid] = inst
            self.t_phase[rid] = self.now
            took += 1
        pool.running += took
        if not blocked and not q and not inst.hungry and (
                inst.b + inst.colo_pending < inst.perf.max_batch or inst.pre_tokens < inst.chunk_alone):
            inst.hungry = True
            pool.hungry.append(inst)
        return took

    def _on_wake(self, inst: Instance, version: int) -> None:
        if version != inst.version or not inst.alive:
            return
        inst.advance(self.now, self.tel)
        pool = self.pools[inst.pool]
        while True:
            rid = inst.pop_decode_done()
            if rid is None:
                break
            self._decode_done(pool, inst, rid)
        while True:
            rid = inst.pop_prefill_done(self.prompt)
            if rid is None:
                break
            self._prefill_done(pool, inst, rid)
        if not inst.b and not inst.pre_q and not inst.kv_held:
            inst.kv_used = 0.0
            inst.sum_ctx = 0.0
        self._fill(pool, inst)
        self._schedule(inst)

    # ------------------------------------------------------------------ views for drivers
    def request_work(self, rid: int) -> tuple[int, int, int, int, int]:
        """(prompt tokens, output tokens, job, tenant index, attempt)."""
        j = self.job[rid]
        return self.prompt[rid], self.output[rid], j, int(self.w.job_tenant[j]), self.attempt[rid]

    def pool_load(self, i: int) -> tuple[int, int, int, int]:
        """(queued requests, queued prefill tokens, queued decode tokens, running requests)."""
        p = self.pools[i]
        return len(p.q_pre) + len(p.q_dec), p.q_pre_tokens, p.q_dec_tokens, p.running

