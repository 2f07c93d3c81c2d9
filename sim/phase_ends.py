"""The ends of a request's phases on an instance: what the simulator does when a prefill, a KV
transfer or a decode finishes.

A finished prefill either turns into decode on the same instance (a colocated request) or holds
its KV on the instance and starts a transfer over the pool-to-pool link (FIFO per link: a
transfer waits for the one before it); the transfer's end frees the KV at the source and queues
the request at its decode pool (lost if that pool is gone). A finished decode gives the
request's slot and tokens back, settles its speculative twin, counts it towards its job, and
asks the driver for the next release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phaseroute.schemas.enums import JobState
from phaseroute.sim.events import DECODE, DONE, QUEUED_DECODE, RELEASE, TRANSFER, XFER

if TYPE_CHECKING:
    from phaseroute.sim.engine import PoolRun
    from phaseroute.sim.host import SimHost
    from phaseroute.sim.instance import Instance


class PhaseEnds:
    """Mixin of ``Simulator``: the prefill, transfer and decode completion handlers."""

    def _prefill_done(self: SimHost, pool: PoolRun, inst: Instance, rid: int) -> None:
        if not self.colo[rid] and self.self_released:
            self.driver.on_kv_ready(rid, self.now)
        if self.colo[rid]:
            inst.colo_pending -= 1
            inst.take_decode(rid, self.output[rid], self.ctx[rid], 0.0, reserved=True)
            self.status[rid] = DECODE
            self.t_phase[rid] = self.now
            return
        pool.running -= 1
        inst.kv_held.add(rid)
        self.status[rid] = TRANSFER
        dst = self.pools[self.dec_pool[rid]]
        link = self.fleet.links[(pool.spec.parent, dst.spec.parent)]
        nbytes = pool.kvpt * self.prompt[rid]
        start = max(self.now, self.links_busy.get((link.src, link.dst), 0.0))
        service = link.latency_s + nbytes / link.bandwidth
        self.links_busy[(link.src, link.dst)] = start + service
        self.push(start + service, XFER, rid, (self.attempt[rid], nbytes, service, start - self.now))

    def _on_xfer(self: SimHost, rid: int, info: tuple[int, float, float, float]) -> None:
        attempt, nbytes, service, queued = info
        if self.attempt[rid] != attempt:
            return
        inst = self.where[rid]
        assert inst is not None        # the source instance holds the KV until the transfer ends (same attempt)
        src = self.pools[inst.pool]
        inst.kv_held.discard(rid)
        inst.advance(self.now, self.tel)
        inst.kv_used -= nbytes
        if self._fill(src, inst):
            self._schedule(inst)
        dst = self.pools[self.dec_pool[rid]]
        self.tel.record_transfer(src.spec.parent, dst.spec.parent, nbytes, service, queued)
        self.counters["kv_bytes"] += nbytes
        self.counters["transfers"] += 1
        if not dst.alive:
            self._lost(rid, dst.idx, "pool_lost")
            return
        self.status[rid] = QUEUED_DECODE
        self.where[rid] = None
        dst.q_dec.append(rid)
        dst.q_dec_tokens += self.output[rid]
        self._dispatch(dst)

    def _decode_done(self: SimHost, pool: PoolRun, inst: Instance, rid: int) -> None:
        inst.b -= 1
        inst.sum_ctx -= self.ctx[rid]
        inst.kv_used -= pool.kvpt * (self.prompt[rid] + self.output[rid])
        pool.running -= 1
        self.status[rid] = DONE
        self.where[rid] = None
        self.t_done[rid] = self.now
        self.driver.on_done(rid, self.now)
        if rid in self.twin:
            rid = self._twin_finished(rid)     # the original row stands for the request
            self.status[rid] = DONE
            self.t_done[rid] = self.now
        self.inflight -= 1
        self.inflight_tokens -= self.prompt[rid] + self.output[rid]
        self.tokens_done += self.prompt[rid] + self.output[rid]
        j = self.job[rid]
        self.job_left[j] -= 1
        if self.job_left[j] == 0 and self.job_state[j] is JobState.ADMITTED:
            self.job_done_t[j] = self.now
            self.job_state[j] = JobState.COMPLETED
            self.unresolved_jobs -= 1
        if not self.release_pending and not self.self_released and self.driver.backlog():
            self.release_pending = True
            self.push(self.now + self.cfg.release_interval_s, RELEASE)
