"""Speculative copies of straggling attempts (the policy decides which; the first result wins).

At every profile refresh the simulator lists the attempts running on instances (phase,
pool, start of the phase, tokens, batch) and asks a driver that has ``stragglers`` which are
stragglers (phaseroute's driver does not: the control core finds its stragglers itself and
places the copy through ``twin_of`` + ``place``). Each straggler gets a copy:
a new request row with the same prompt, output and job, routed by the driver away from the
pool the original runs on. Whichever of the two finishes decode first completes the request
(counted once); the other is cancelled wherever it is (queue, prefill, transfer, decode) and
its memory is freed. A copy that is lost while its twin still runs is simply dropped.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from phaseroute.schemas.enums import Phase
from phaseroute.sim.events import CANCELLED, DECODE, NEW, PREFILL, QUEUED_DECODE, QUEUED_PREFILL, TRANSFER

if TYPE_CHECKING:
    from phaseroute.sim.host import SimHost
    from phaseroute.sim.instance import Instance


class Speculation:
    """Mixin of ``Simulator``: straggler copies and cancellation."""

    def _speculate(self: SimHost) -> None:
        find = getattr(self.driver, "stragglers", None)
        if find is None:
            return
        running: list[tuple[int, Phase, int, float, int, int]] = []
        t_phase, twin = self.t_phase, self.twin
        for pool in self.pools:
            for inst in pool.instances:
                if not inst.alive:
                    continue
                for _, rid in inst.dec_heap:
                    if rid not in twin:
                        running.append((rid, Phase.DECODE, pool.idx, t_phase[rid], self.output[rid], inst.b))
                for rid in inst.pre_q:
                    if rid not in twin:
                        running.append((rid, Phase.PREFILL, pool.idx, t_phase[rid], self.prompt[rid], 1))
        for rid, avoid in find(running, self.now):
            self._clone(rid, avoid)

    def _clone(self: SimHost, rid: int, avoid: frozenset[str]) -> None:
        new = self.twin_of(rid)
        self.driver.on_speculate(rid, new, avoid, self.now)
        self._route(new)

    def twin_of(self: SimHost, rid: int) -> int:
        """A new request row with the same prompt, output and job as ``rid``, linked as its twin."""
        new = len(self.prompt)
        columns: tuple[tuple[list[Any], object], ...] = (  # each request column, with the copy's value
            (self.prompt, self.prompt[rid]), (self.output, self.output[rid]), (self.job, self.job[rid]),
            (self.ctx, self.ctx[rid]), (self.status, NEW), (self.attempt, 0), (self.pre_pool, -1),
            (self.dec_pool, -1), (self.colo, False), (self.where, None), (self.t_done, float("nan")),
            (self.req_tenant, self.req_tenant[rid]), (self.t_phase, self.now))
        for column, value in columns:
            column.append(value)
        self.twin[new], self.twin[rid] = rid, new
        self.counters["speculated"] += 1
        return new

    def _cancel(self: SimHost, rid: int) -> None:
        """Withdraw a request's attempt wherever it is; its twin carries the request on."""
        status, where = self.status[rid], self.where[rid]
        if status == QUEUED_PREFILL:
            pool = self.pools[self.pre_pool[rid]]
            pool.q_pre.remove(rid)
            pool.q_pre_tokens -= self.prompt[rid]
        elif status == QUEUED_DECODE:
            pool = self.pools[self.dec_pool[rid]]
            pool.q_dec.remove(rid)
            pool.q_dec_tokens -= self.output[rid]
        elif status in (PREFILL, DECODE, TRANSFER) and where is not None:
            self._withdraw(where, rid, status)
        self.attempt[rid] += 1          # stale transfer and retry events are ignored from now on
        self.status[rid] = CANCELLED
        self.where[rid] = None
        self.driver.on_cancel(rid, self.now)

    def _withdraw(self: SimHost, inst: Instance, rid: int, status: int) -> None:
        pool = self.pools[inst.pool]
        inst.advance(self.now, self.tel)
        kvpt, prompt, output = pool.kvpt, self.prompt[rid], self.output[rid]
        if status == PREFILL:
            colocated = self.colo[rid]
            if inst.pre_q and inst.pre_q[0] == rid:
                inst.pre_tokens -= max(inst.pre_left, 0.0)
                inst.pre_q.popleft()
                inst.pre_left = float(self.prompt[inst.pre_q[0]]) if inst.pre_q else 0.0
            else:
                inst.pre_q.remove(rid)
                inst.pre_tokens -= prompt
            if not inst.pre_q:
                inst.pre_tokens = 0.0
            inst.kv_used -= kvpt * (prompt + (output if colocated else 0))
            inst.colo_pending -= 1 if colocated else 0
            pool.running -= 1
        elif status == DECODE:
            k = next(i for i, (_, r) in enumerate(inst.dec_heap) if r == rid)
            inst.dec_heap[k] = inst.dec_heap[-1]
            inst.dec_heap.pop()
            heapq.heapify(inst.dec_heap)
            inst.b -= 1
            inst.sum_ctx -= self.ctx[rid]
            inst.kv_used -= kvpt * (prompt + output)
            pool.running -= 1
        else:   # TRANSFER: the KV waits on the source instance
            inst.kv_held.discard(rid)
            inst.kv_used -= kvpt * prompt
        self._fill(pool, inst)
        self._schedule(inst)

    def _twin_finished(self: SimHost, rid: int) -> int:
        """``rid`` finished decode: cancel its twin; return the request's original row."""
        other = self.twin.pop(rid)
        del self.twin[other]
        if self.status[other] != CANCELLED:
            self._cancel(other)
        if rid >= self.w.n_requests:
            self.counters["speculation_wins"] += 1
            return other
        return rid
