"""Pool loss: when a pool's heartbeats stop, re-dispatch everything in flight on it.

A pool is dead when it says so or when its last heartbeat is older than the timeout. Each
in-flight attempt on a dead pool becomes a :class:`Redispatch` at once (no backoff: the
request did nothing wrong), with the dead pools to avoid. A decode attempt whose KV lived only
on dead pools goes back to prefill; one whose KV survives elsewhere (another pool, the KV
store) decodes again. A request that still has an attempt running on a live pool is left
alone (that copy will finish it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .lifecycle import attempt_id
from .types import Phase, PoolState


@dataclass(frozen=True)
class InFlightAttempt:
    request_id: str
    phase: Phase
    attempt: int
    pool: str
    attempts_started: int  # attempts of this request ever started; the re-dispatch gets this number
    kv_locations: frozenset[str] = frozenset()  # where a decode's KV lives: pool names or e.g. "kvstore"


@dataclass(frozen=True)
class Redispatch:
    request_id: str
    phase: Phase
    attempt: int
    avoid_pools: frozenset[str]
    kv_lost: bool
    reason: str

    @property
    def attempt_id(self) -> str:
        return attempt_id(self.request_id, self.phase, self.attempt)


def dead_pools(pools: Iterable[PoolState], now: float, heartbeat_timeout_s: float) -> frozenset[str]:
    """Pools that say they are not alive or whose last heartbeat is older than the timeout."""
    return frozenset(p.name for p in pools if not p.alive or now - p.last_heartbeat > heartbeat_timeout_s)


def redispatch_lost(in_flight: Iterable[InFlightAttempt], dead: frozenset[str]) -> list[Redispatch]:
    """One re-dispatch per request that had attempts only on dead pools."""
    by_request: dict[str, list[InFlightAttempt]] = {}
    for a in in_flight:
        by_request.setdefault(a.request_id, []).append(a)
    out = []
    for request_id in sorted(by_request):
        attempts = by_request[request_id]
        if any(a.pool not in dead for a in attempts):
            continue
        latest = max(attempts, key=lambda a: a.attempt)
        kv_lost = latest.phase is Phase.DECODE and not (latest.kv_locations - dead)
        phase = Phase.PREFILL if kv_lost else latest.phase
        note = "; its KV lived only there: prefill again" if kv_lost else ""
        out.append(
            Redispatch(
                request_id,
                phase,
                max(a.attempts_started for a in attempts),
                frozenset(dead) & {a.pool for a in attempts},
                kv_lost,
                f"pool {latest.pool} lost during {latest.phase.slug} attempt #{latest.attempt}{note}",
            )
        )
    return out
