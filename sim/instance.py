"""One model instance: a fluid model of continuous batching, advanced only at events.

Between two events an instance's batch is constant, so every engine step takes the same
time ``tau`` (perfmodel). Decode requests advance one token per step: instead of touching
each request, the instance keeps a virtual step counter ``v`` and each running request its
finishing count (``v`` at join + output tokens) in a heap, so an event costs O(log batch).
Prompts are prefilled FIFO in chunks of ``c`` tokens per step, beside the running decodes
(chunked prefill, as Sarathi/vLLM do) or alone on a prefill-only instance.

Request life on an instance: pool queue -> ``take_prefill`` (KV reserved) -> prefill chunks ->
``colocated``: joins this instance's decode batch | else: KV held until the transfer ends ->
``release_kv``. Or: pool decode queue -> ``take_decode`` -> decode batch -> done.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING

from phaseroute.sim.perfmodel import InstancePerf

if TYPE_CHECKING:
    from phaseroute.sim.telemetry import Telemetry

EPS = 1e-7


class Instance:
    __slots__ = ("pool", "id", "perf", "alive", "slowdown", "v", "dec_heap", "b", "sum_ctx", "kv_used",
                 "pre_q", "pre_left", "pre_tokens", "colo_pending", "tau", "c", "l_pre", "last_t", "version",
                 "busy_s", "hungry", "kv_held", "chunk_alone", "chunk_mixed")

    def __init__(self, pool: int, ident: int, perf: InstancePerf, chunk_alone: int, chunk_mixed: int):
        self.pool = pool
        self.id = ident
        self.perf = perf
        self.alive = True
        self.slowdown = 1.0
        self.chunk_alone = chunk_alone
        self.chunk_mixed = chunk_mixed
        self.version = 0
        self.busy_s = 0.0
        self.reset(0.0)

    def reset(self, now: float) -> None:
        """Empty the instance (start, failure, repair); busy time and version carry on."""
        self.v = 0.0
        self.dec_heap: list[tuple[float, int]] = []
        self.b = 0
        self.sum_ctx = 0.0
        self.kv_used = 0.0
        self.pre_q: deque[int] = deque()
        self.pre_left = 0.0      # tokens left of the head prompt
        self.pre_tokens = 0.0    # tokens left of all queued prompts
        self.colo_pending = 0    # colocated prompts here that will join the batch
        self.tau = 0.0
        self.c = 0.0
        self.l_pre = 0
        self.last_t = now
        self.version += 1        # invalidates any wake-up scheduled before the reset
        self.hungry = False
        self.kv_held: set[int] = set()

    def advance(self, now: float, tel: Telemetry) -> None:
        """Account the steps run since ``last_t`` (batch unchanged in between)."""
        dt = now - self.last_t
        if dt > 0.0 and self.tau > 0.0:
            steps = dt / self.tau
            if self.b:
                self.v += steps
            if self.c:
                done = self.c * steps
                self.pre_left -= done
                self.pre_tokens -= done
            self.busy_s += dt
            tel.record(self.pool, self.b, self.c, steps, self.tau, self.l_pre)
        self.last_t = now

    def retune(self, prompt: list[int]) -> float:
        """Recompute the step time for the current batch; returns seconds to the next completion
        (inf when idle)."""
        if self.pre_q:
            self.c = min(self.chunk_mixed if self.b else self.chunk_alone, self.pre_tokens)
            l_pre = self.l_pre = prompt[self.pre_q[0]]
        else:
            self.c = 0.0
            l_pre = self.l_pre = 0
        if not self.b and not self.c:
            self.tau = 0.0
            return float("inf")
        self.tau = self.perf.step_time(self.b, self.sum_ctx, self.c, l_pre, self.slowdown)
        nxt = float("inf")
        if self.b:
            nxt = max(self.dec_heap[0][0] - self.v, 0.0) * self.tau
        if self.c:
            nxt = min(nxt, max(self.pre_left, 0.0) / self.c * self.tau)
        return nxt

    # --- capacity predicates and actions (called by the pool dispatcher) ---

    def room_decode(self, need_kv: float) -> bool:
        return self.b + self.colo_pending < self.perf.max_batch and self.kv_used + need_kv <= self.perf.kv_capacity

    def room_prefill(self, need_kv: float, colocated: bool) -> bool:
        if self.pre_tokens >= self.chunk_alone or self.kv_used + need_kv > self.perf.kv_capacity:
            return False
        return not colocated or self.b + self.colo_pending < self.perf.max_batch

    def take_prefill(self, rid: int, prompt_len: int, need_kv: float, colocated: bool) -> None:
        if not self.pre_q:
            self.pre_left = float(prompt_len)
        self.pre_q.append(rid)
        self.pre_tokens += prompt_len
        self.kv_used += need_kv
        if colocated:
            self.colo_pending += 1

    def take_decode(self, rid: int, out_len: int, ctx: float, need_kv: float, reserved: bool = False) -> None:
        heapq.heappush(self.dec_heap, (self.v + out_len, rid))
        self.b += 1
        self.sum_ctx += ctx
        if not reserved:
            self.kv_used += need_kv

    def pop_prefill_done(self, prompt: list[int]) -> int | None:
        if self.pre_q and self.pre_left <= EPS * max(1.0, prompt[self.pre_q[0]]):
            rid = self.pre_q.popleft()
            carry = self.pre_left  # <= 0: tokens over-processed belong to the next prompt
            if self.pre_q:
                self.pre_left = prompt[self.pre_q[0]] + carry
            else:
                self.pre_left = 0.0
                self.pre_tokens = 0.0
            return rid
        return None

    def pop_decode_done(self) -> int | None:
        if self.dec_heap and self.dec_heap[0][0] <= self.v + EPS:
            return heapq.heappop(self.dec_heap)[1]
        return None

    def requests(self) -> list[int]:
        """Every request whose work or KV is on this instance (for failures)."""
        return [rid for _, rid in self.dec_heap] + list(self.pre_q) + list(self.kv_held)
