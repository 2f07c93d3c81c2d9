"""The fleet as the core sees it: pools from heartbeats plus the core's own counts.

Heartbeats (``FleetObserved``) say which pools are alive and what they hold; the core adds what
only it knows: attempts in flight on each pool (it dispatched them) and the pool's failures in
the last ``failure_window_s``. ``states`` gives the router one ``PoolState`` per pool; a pool
whose inputs did not change keeps its object (routing many requests in one tick re-asks about
every pool, and building a PoolState is not free). ``free_slots`` is the backpressure rule:
requests the fleet can take now, by batch rows and by KV memory, so that work waits where the
fair scheduler and the router still choose (the core) rather than in a pool's FIFO queue.
"""

from __future__ import annotations

from collections import deque

from phaseroute.schemas.enums import Phase
from phaseroute.streams.policy import PoolState, ProfileTable, dead_pools


def _counted(o: PoolState, in_flight: int, failures: int) -> PoolState:
    """``o`` with the core's counts (positional: ``dataclasses.replace`` costs 10x more, and this
    runs once per dispatch)."""
    return PoolState(o.name, o.alive, o.phases, o.models, o.variant, o.workers, o.max_batch, o.free_kv_bytes,
                     o.queue_requests, o.queue_tokens, in_flight, failures, o.last_heartbeat, o.price_per_hour,
                     o.worker_free_kv_bytes, o.worker_kv_capacity_bytes, o.kv_format)


class FleetState:
    def __init__(self, failure_window_s: float, heartbeat_timeout_s: float, kv_in_flight_factor: float) -> None:
        self.failure_window_s = failure_window_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.kv_in_flight_factor = kv_in_flight_factor
        self._observed: dict[str, PoolState] = {}
        self._in_flight: dict[str, int] = {}
        self._in_flight_tokens: dict[str, int] = {}  # prompt + max_tokens of the attempts on each pool
        self._kv_per_token: dict[str, float] = {}  # measured KV bytes per token of each pool (decode rows)
        self._tokens_per_request = 0.0  # mean size of the requests dispatched (decayed)
        self._failures: dict[str, deque[float]] = {}
        self._cache: dict[str, tuple[tuple[int, int], PoolState]] = {}
        self._states: tuple[PoolState, ...] | None = None
        self.version = 0  # bumps when what the router sees of any pool changes

    # -- inputs ------------------------------------------------------------------------------
    def observe(self, pools: tuple[PoolState, ...]) -> None:
        self._observed = {p.name: p for p in pools}
        self._cache.clear()
        self._states = None
        self.version += 1

    def add_in_flight(self, pool: str, delta: int, tokens: int) -> None:
        """An attempt of a request of ``tokens`` (prompt + max_tokens) starts (+1) or stops (-1) on ``pool``."""
        self._in_flight[pool] = self._in_flight.get(pool, 0) + delta
        self._in_flight_tokens[pool] = self._in_flight_tokens.get(pool, 0) + delta * tokens
        if delta > 0:
            mean = self._tokens_per_request
            self._tokens_per_request = float(tokens) if mean == 0.0 else 0.99 * mean + 0.01 * tokens
        if pool in self._observed:
            self._states = None

    def learn_kv_sizes(self, table: ProfileTable) -> None:
        """KV bytes per token of each pool, from its decode rows (the largest over models)."""
        sizes: dict[str, float] = {}
        for (_, phase, pool, _, _), row in table.rows.items():
            if phase is Phase.DECODE and row.kv_bytes_per_token > 0:
                sizes[pool] = max(sizes.get(pool, 0.0), row.kv_bytes_per_token)
        self._kv_per_token = sizes

    def record_failure(self, pool: str, now: float) -> None:
        self._failures.setdefault(pool, deque()).append(now)
        if pool in self._observed:
            self._states = None

    def age(self, now: float) -> None:
        """Forget failures older than the window (once per tick)."""
        for times in self._failures.values():
            if times and now - times[0] > self.failure_window_s:
                while times and now - times[0] > self.failure_window_s:
                    times.popleft()
                self._states = None

    # -- views -------------------------------------------------------------------------------
    def in_flight(self, pool: str) -> int:
        return self._in_flight.get(pool, 0)

    def states(self) -> tuple[PoolState, ...]:
        """Every observed pool with the core's in-flight count and recent failures (as of the
        last ``age``)."""
        if self._states is not None:
            return self._states
        out = []
        for name, observed in self._observed.items():
            key = (self._in_flight.get(name, 0), len(self._failures.get(name) or ()))
            hit = self._cache.get(name)
            if hit is None or hit[0] != key:
                hit = (key, _counted(observed, max(key[0], 0), key[1]))
                self._cache[name] = hit
            out.append(hit[1])
        self._states = tuple(out)
        return self._states

    def dead(self, now: float) -> frozenset[str]:
        return dead_pools(self._observed.values(), now, self.heartbeat_timeout_s)

    def free_slots(self, now: float, slots_per_worker: int) -> int:
        """Requests the fleet can take now. Every request needs a prefill and a decode, so the
        free prefill rows are capped by the decode rows left (in-flight attempts count against
        decode wherever they are); and the in-flight requests' tokens stay within
        ``kv_in_flight_factor`` x the KV memory of the decode pools (where heartbeats report
        their workers' capacity and a profile their KV bytes per token)."""
        dead = self.dead(now)
        live = [p for p in self._observed.values() if p.name not in dead]
        prefill = sum(max(0, p.workers * p.max_batch * slots_per_worker - self.in_flight(p.name))
                      for p in live if Phase.PREFILL in p.phases)
        decoders = [p for p in live if Phase.DECODE in p.phases]
        decode = sum(p.workers * p.max_batch * slots_per_worker for p in decoders)
        busy = sum(max(0, n) for n in self._in_flight.values())
        free = min(prefill, max(0, decode - busy))
        return min(free, self._kv_free_requests(decoders))

    def _kv_free_requests(self, decoders: list[PoolState]) -> int:
        capacity = 0.0
        for p in decoders:
            per_token = self._kv_per_token.get(p.name)
            if p.worker_kv_capacity_bytes is None or not per_token:
                return 2**31  # a pool that does not say cannot be ruled out
            capacity += p.workers * p.worker_kv_capacity_bytes / per_token
        held = sum(max(0, n) for n in self._in_flight_tokens.values())
        room = self.kv_in_flight_factor * capacity - held
        if room <= 0:
            return 0
        return int(room / self._tokens_per_request) if self._tokens_per_request > 0 else 2**31

    def known(self, pool: str) -> bool:
        return pool in self._observed
