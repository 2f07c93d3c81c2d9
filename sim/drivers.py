"""Drivers: the decisions a simulated run delegates (admission, release order, routing, retries).

phaseroute itself is ``core_driver.CoreDriver`` (the control core the live plane runs); the baselines here
are what phaseroute is compared against. Baselines admit every job some alive pool can
physically serve (``limits``: context length, KV of one instance, model placement; a job
with a request none can serve is rejected at submission, as any engine's request validation
would, so it is a miss for every policy alike), release requests FIFO in job-submission
order under the same backpressure, retry a lost request at once on another pool (up to
``MAX_ATTEMPTS``), and never send a request to a pool that is dead, lacks its model, or
cannot run it within those limits (a sensible system would not either):

- ``rr``: colocated round-robin over instances (smooth weighted round-robin across pools,
  weights = instance counts).
- ``jsq``: colocated join-shortest-queue: the pool with the fewest queued + running requests
  per instance.
- ``split``: static phase split by datasheet, as Splitwise-HA: prefill on the newest
  accelerator generation, decode on the older ones, fixed; join-shortest-queue within each side.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from phaseroute.schemas.enums import Phase
from phaseroute.sim.limits import PoolLimits, feasible_requests, why_infeasible

if TYPE_CHECKING:
    from phaseroute.sim.engine import Simulator

MAX_ATTEMPTS = 5


class Driver:
    """FIFO release and the bookkeeping every driver shares."""

    name = "base"

    def attach(self, sim: Simulator) -> None:
        self.sim = sim
        self.queue: deque[list[int]] = deque()   # [next request, end] per admitted job, FIFO
        self.n_backlog = 0
        w = sim.w
        self.models = [w.tenants[t].model for t in range(len(w.tenants))]
        self.pool_models = [p.spec.model for p in sim.pools]
        self.limits = [PoolLimits.of(p.spec) for p in sim.pools]
        self.avoid: dict[int, set[int]] = {}

    # admission
    def submit(self, job: int, now: float) -> str | None:
        w = self.sim.w
        first, count = int(w.job_first[job]), int(w.job_count[job])
        reason = self.infeasible(job)
        if reason is not None:
            return reason
        self.queue.append([first, first + count])
        self.n_backlog += count
        return None

    def infeasible(self, job: int) -> str | None:
        """Why no alive pool can serve some request of ``job`` (None: every request can run)."""
        w, sim = self.sim.w, self.sim
        first, count = int(w.job_first[job]), int(w.job_count[job])
        alive = [lim for p, lim in zip(sim.pools, self.limits, strict=True) if p.alive]
        model = self.models[int(w.job_tenant[job])]
        prompt, output = w.req_prompt[first:first + count], w.req_output[first:first + count]
        ok = feasible_requests(alive, prompt, output, [model] * count)
        if ok.all():
            return None
        k = int(np.flatnonzero(~ok)[0])
        why = why_infeasible(alive, int(prompt[k]), int(output[k]), model)
        return f"infeasible: request {first + k} of job {job}: {why}"

    def backlog(self) -> int:
        return self.n_backlog

    def release(self, free: int, now: float) -> list[int]:
        out: list[int] = []
        while self.queue and len(out) < free:
            head = self.queue[0]
            take = min(free - len(out), head[1] - head[0])
            out.extend(range(head[0], head[0] + take))
            head[0] += take
            if head[0] >= head[1]:
                self.queue.popleft()
        self.n_backlog -= len(out)
        return out

    def on_done(self, rid: int, now: float) -> None:
        self.avoid.pop(rid, None)

    def on_lost(self, rid: int, pool: int, now: float, cause: str, phase: Phase) -> float | None:
        if self.sim.attempt[rid] >= MAX_ATTEMPTS:
            return None
        self.avoid.setdefault(rid, set()).add(pool)
        return now

    def give_up_unplaced(self, rid: int, since: float, now: float) -> bool:
        """Baselines retry a request no pool accepts until the run ends."""
        return False

    def refresh(self, now: float) -> None:
        pass

    def on_cancel(self, rid: int, now: float) -> None:
        self.avoid.pop(rid, None)

    def route(self, rid: int, now: float) -> tuple[int, int] | None:
        raise NotImplementedError

    # helpers for baselines
    def eligible(self, rid: int, phase: Phase, colocated: bool) -> list[int]:
        sim = self.sim
        model = self.models[int(sim.w.job_tenant[sim.job[rid]])]
        avoid = self.avoid.get(rid, ())
        prompt, output = sim.prompt[rid], sim.output[rid]
        # colocated: one instance prefills and then decodes, so it must hold the decode phase's KV
        need = Phase.DECODE if colocated or phase is Phase.DECODE else Phase.PREFILL
        out = []
        for i, p in enumerate(sim.pools):
            spec = p.spec
            if (p.alive and spec.model == model and i not in avoid and phase in spec.phases
                    and (not colocated or len(spec.phases) == 2)     # both phases (a spec lists each once)
                    and self.limits[i].holds(prompt, output, need)):
                out.append(i)
        if not out and avoid:       # every other pool is gone: try the avoided ones again
            self.avoid[rid] = set()
            return self.eligible(rid, phase, colocated)
        return out

    def load(self, i: int) -> float:
        p = self.sim.pools[i]
        n = p.alive_instances
        return (len(p.q_pre) + len(p.q_dec) + p.running) / n if n else float("inf")


class RoundRobin(Driver):
    name = "rr"

    def attach(self, sim: Simulator) -> None:
        super().attach(sim)
        self.credit = [0.0] * len(sim.pools)

    def route(self, rid: int, now: float) -> tuple[int, int] | None:
        pools = self.eligible(rid, Phase.PREFILL, True)
        if not pools:
            return None
        weights = {i: self.sim.pools[i].alive_instances for i in pools}
        total = sum(weights.values())
        for i in pools:
            self.credit[i] += weights[i]
        best = max(pools, key=lambda i: (self.credit[i], -i))
        self.credit[best] -= total
        return best, best


class JoinShortestQueue(Driver):
    name = "jsq"

    def route(self, rid: int, now: float) -> tuple[int, int] | None:
        pools = self.eligible(rid, Phase.PREFILL, True)
        if not pools:
            return None
        best = min(pools, key=lambda i: (self.load(i), i))
        return best, best


class StaticSplit(Driver):
    """Prefill on the newest generation, decode on the rest, fixed at start (Splitwise-HA)."""

    name = "split"

    def attach(self, sim: Simulator) -> None:
        super().attach(sim)
        self.prefill_side: dict[str, set[int]] = {}
        for model in set(self.pool_models):
            idx = [i for i, m in enumerate(self.pool_models) if m == model]
            newest = max(sim.pools[i].spec.accelerator.generation for i in idx)
            pre = {i for i in idx if sim.pools[i].spec.accelerator.generation == newest}
            self.prefill_side[model] = pre if len(pre) < len(idx) else set()

    def route(self, rid: int, now: float) -> tuple[int, int] | None:
        model = self.models[int(self.sim.w.job_tenant[self.sim.job[rid]])]
        pre_side = self.prefill_side.get(model, set())
        pre = [i for i in self.eligible(rid, Phase.PREFILL, False) if i in pre_side]
        dec = [i for i in self.eligible(rid, Phase.DECODE, False) if i not in pre_side]
        if not pre_side or not pre or not dec:
            # one generation only, or a whole side is gone: colocate on what is left
            pools = self.eligible(rid, Phase.PREFILL, True)
            if not pools:
                return None
            best = min(pools, key=lambda i: (self.load(i), i))
            return best, best
        a = min(pre, key=lambda i: (self.load(i), i))
        b = min(dec, key=lambda i: (self.load(i), i))
        return a, b


BASELINES = {"rr": RoundRobin, "jsq": JoinShortestQueue, "split": StaticSplit}
