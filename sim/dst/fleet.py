"""A fake fleet for deterministic simulation testing of the control core (named a fake: it models
no accelerator, only what the control plane can observe of one).

Each pool has workers with ``max_batch`` rows; work waits FIFO and takes a seeded service time
(prompt / prefill rate + output / decode rate, times the pool's slowdown). A dispatched attempt
runs prefill on its prefill pool; a disaggregated one then says ``KvReady`` and joins its decode
pool's queue; at the end the fleet produces a result. Faults, all drawn from the seed:
attempts fail (retryably, or as invalid input), KV blobs are lost in transfer, pools slow
down, pools vanish (their work is dropped and their heartbeats stop) and come back empty.
The fleet talks to the core only through messages it hands to the harness (``out``).
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Any

from phaseroute.schemas.enums import Phase
from phaseroute.streams.core import AttemptFailed, Dispatch, KvReady
from phaseroute.streams.policy import FailureKind, PoolState

WorkItem = tuple[Phase, Dispatch, int]   # (the phase to run, the dispatched attempt, the pool's epoch when queued)


@dataclass
class Faults:
    attempt_failure: float = 0.02   # an attempt fails retryably
    invalid: float = 0.002          # an attempt fails as invalid input (never retried)
    kv_lost: float = 0.02           # a disaggregated attempt's KV blob is lost (checksum failure)
    pool_loss_per_s: float = 0.002  # rate at which some pool vanishes
    pool_down_s: tuple[float, float] = (5.0, 60.0)
    slowdown_per_s: float = 0.003   # rate at which some pool slows down (or recovers)
    slowdown: tuple[float, float] = (3.0, 30.0)


@dataclass
class SimPool:
    name: str
    phases: frozenset[Phase]
    workers: int
    max_batch: int
    prefill_tps: float
    decode_tps: float
    variant: str = "fp32"
    alive: bool = True
    slowdown: float = 1.0
    last_beat: float = 0.0
    busy: int = 0
    queue: list[WorkItem] = field(default_factory=list)  # FIFO of waiting items
    epoch: int = 0  # bumps when the pool is lost: its items in flight are dropped
    silent: bool = False  # lost without a word: its heartbeats just stop (else it said DOWN)

    def state(self, model: str) -> PoolState:
        cap = 4e9
        says_alive = self.alive or self.silent
        return PoolState(self.name, says_alive, self.phases, frozenset({model}), self.variant, self.workers,
                         self.max_batch, cap * self.workers, len(self.queue), 0, 0, 0, self.last_beat, None, cap, cap,
                         f"{model}|fp32")


class FakeFleet:
    def __init__(self, pools: list[SimPool], model: str, faults: Faults, rng: random.Random) -> None:
        self.pools = {p.name: p for p in pools}
        self.model = model
        self.faults = faults
        self.rng = rng
        self.timers: list[tuple[float, int, str, tuple[Any, ...]]] = []
        self._seq = 0
        self.out: list[tuple[float, Any]] = []  # (when, message for the core or the sink)
        self.calm = False  # no new faults (the drain at the end of a run)
        self.counts = {"pool_losses": 0, "slowdowns": 0, "failed_attempts": 0, "kv_lost": 0, "invalid": 0}

    def _at(self, t: float, kind: str, *args: Any) -> None:
        self._seq += 1
        heapq.heappush(self.timers, (t, self._seq, kind, args))

    # -- the control plane's sends --------------------------------------------------------------
    def dispatch(self, d: Dispatch, now: float) -> None:
        pool = self.pools.get(d.prefill_pool)
        if pool is None or not pool.alive:
            return  # the work sits in a dead pool's topic: nobody runs it
        self._enqueue(pool, (Phase.PREFILL, d, pool.epoch), now)

    def _enqueue(self, pool: SimPool, item: WorkItem, now: float) -> None:
        pool.queue.append(item)
        self._start(pool, now)

    def _start(self, pool: SimPool, now: float) -> None:
        while pool.alive and pool.queue and pool.busy < pool.workers * pool.max_batch:
            item = pool.queue.pop(0)
            phase, d = item[0], item[1]
            w = d.work
            tokens = w.prompt_tokens / pool.prefill_tps if phase is Phase.PREFILL else 0.0
            if phase is Phase.DECODE or d.colocated:
                tokens += w.max_output_tokens / pool.decode_tps
            service = tokens * pool.slowdown * self.rng.uniform(0.7, 1.5)
            pool.busy += 1
            self._at(now + service, "done", pool.name, pool.epoch, item)

    def advance(self, now: float) -> None:
        """Run the fleet's timers up to ``now``."""
        while self.timers and self.timers[0][0] <= now:
            t, _, kind, args = heapq.heappop(self.timers)
            if kind == "done":
                self._done(t, *args)
            elif kind == "return":
                self._return(t, args[0])

    def _done(self, t: float, name: str, epoch: int, item: WorkItem) -> None:
        pool = self.pools[name]
        if epoch != pool.epoch:
            return  # the pool was lost meanwhile: this work vanished with it
        pool.busy -= 1
        phase, d = item[0], item[1]
        w, f = d.work, self.faults
        draw = self.rng.random()
        kind = None
        if draw < f.invalid:
            kind = FailureKind.INVALID
        elif draw < f.invalid + f.attempt_failure:
            kind = FailureKind.ERROR
        elif phase is Phase.DECODE and draw < f.invalid + f.attempt_failure + f.kv_lost:
            kind = FailureKind.KV_CHECKSUM
        if kind is not None:
            self.counts[{FailureKind.INVALID: "invalid", FailureKind.ERROR: "failed_attempts",
                         FailureKind.KV_CHECKSUM: "kv_lost"}[kind]] += 1
            self.out.append((t, AttemptFailed(w.request_id, d.attempt, name, phase, kind, f"fake {kind.value}")))
        elif phase is Phase.PREFILL and not d.colocated:
            self.out.append((t, KvReady(w.request_id, d.attempt, name, "kvstore")))
            target = self.pools.get(d.decode_pool)
            if target is not None and target.alive:
                self._enqueue(target, (Phase.DECODE, d, target.epoch), t)
        else:
            self.out.append((t, ("result", d)))
        self._start(pool, t)

    # -- faults --------------------------------------------------------------------------------
    def maybe_fault(self, now: float, dt: float) -> None:
        if self.calm:
            return
        f = self.faults
        alive = [p for p in self.pools.values() if p.alive]
        if len(alive) > 1 and self.rng.random() < f.pool_loss_per_s * dt:
            self.lose(self.rng.choice(alive), now)
        if self.rng.random() < f.slowdown_per_s * dt:
            self.counts["slowdowns"] += 1
            pool = self.rng.choice(list(self.pools.values()))
            pool.slowdown = 1.0 if pool.slowdown > 1.0 else self.rng.uniform(*f.slowdown)

    def lose(self, pool: SimPool, now: float) -> None:
        self.counts["pool_losses"] += 1
        pool.alive = False
        pool.silent = self.rng.random() < 0.5
        pool.epoch += 1
        pool.queue.clear()
        pool.busy = 0
        self._at(now + self.rng.uniform(*self.faults.pool_down_s), "return", pool.name)

    def _return(self, t: float, name: str) -> None:
        pool = self.pools[name]
        pool.alive, pool.silent, pool.slowdown, pool.last_beat = True, False, 1.0, t

    def recover_all(self, now: float) -> None:
        """The drain: every pool back and at full speed, no new faults."""
        self.calm = True
        for pool in self.pools.values():
            if not pool.alive:
                self._return(now, pool.name)
            pool.slowdown = 1.0

    def heartbeats(self, now: float) -> tuple[PoolState, ...]:
        for pool in self.pools.values():
            if pool.alive:
                pool.last_beat = now
        return tuple(p.state(self.model) for p in self.pools.values())

    def idle(self) -> bool:
        return not self.timers or all(kind == "return" for _, _, kind, _ in self.timers)
