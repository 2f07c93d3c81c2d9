"""Materialized views the router joins against: the profile table and the pool states.

``profiles`` is a compacted topic: the view reads it from the beginning at start (so a
restarted control plane has every row at once) and follows it. Rows carrying ``path_quality``
(published by the drift monitor) become the table's measured path quality, not profile rows. ``pools.heartbeat`` becomes
one ``PoolState`` per pool: alive while a worker's heartbeat is younger than
``dead_after_s`` and not DOWN. (A Faust GlobalTable over the externally written compacted
topic hung in partition assignment with faust-streaming 0.15.3, so the view is a plain
follower thread, ``infra/topic_follower.TopicFollower``; it is read-only state, rebuilt from
Kafka on every start.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from phaseroute.streams.policy import LinkProfile, PathQuality, Phase, PoolState, ProfileRow, ProfileTable
from phaseroute.streams.profiles.convert import from_avro


def path_quality_from_avro(record: dict[str, Any]) -> PathQuality:
    """The policy's path quality of a ``profile_row`` record that carries ``path_quality``."""
    quality = record["path_quality"]
    return PathQuality(
        model=record["model"], src=record["source_pool"] or record["pool"], dst=record["pool"],
        score=min(1.0, max(0.0, float(record["quality_score"] if record["quality_score"] is not None else 0.0))),
        exact_ok=bool(quality["exact_ok"]), samples=int(record["samples"]), updated_at=record["updated_at"] / 1000.0,
    )


class ProfileView:
    """The latest profile row per key, as a policy ``ProfileTable``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, ...], ProfileRow] = {}
        self._links: dict[tuple[str, str], LinkProfile] = {}
        self._quality: dict[tuple[str, str, str], PathQuality] = {}
        self.version = 0

    def on_record(self, record: dict[str, Any]) -> None:
        if record.get("path_quality") is not None:
            quality = path_quality_from_avro(record)
            with self._lock:
                self._quality[quality.key] = quality
                self.version += 1
            return
        converted = from_avro(record)
        with self._lock:
            if isinstance(converted, LinkProfile):
                self._links[(converted.src, converted.dst)] = converted
            else:
                key = (converted.model, converted.phase.value, converted.pool, converted.variant, converted.source.value)
                self._rows[key] = converted
            self.version += 1

    def table(self) -> ProfileTable:
        with self._lock:
            return ProfileTable.from_rows(list(self._rows.values()), list(self._links.values()), list(self._quality.values()))


def _largest_known(values: Iterable[int | None]) -> int | None:
    """The largest value, or None when any is unknown (a worker that does not say cannot be ruled out)."""
    known = list(values)
    if not known or any(v is None for v in known):
        return None
    return max(known)  # type: ignore[type-var]


def _one_format(formats: Iterable[str | None]) -> str | None:
    """The pool's KV format when every worker reports the same one; None otherwise."""
    seen = set(formats)
    return seen.pop() if len(seen) == 1 else None


class PoolView:
    """Pool states from worker heartbeats (and the control plane's own in-flight counts)."""

    def __init__(self, dead_after_s: float = 8.0) -> None:
        self._lock = threading.Lock()
        self._workers: dict[str, dict[str, Any]] = {}
        self.dead_after_s = dead_after_s

    def on_record(self, beat: dict[str, Any]) -> None:
        with self._lock:
            known = self._workers.get(beat["worker_id"])
            if known is None or known["at"] <= beat["at"]:
                self._workers[beat["worker_id"]] = beat

    def workers(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._workers.values())

    def states(self, now: float, in_flight: dict[str, int], failures: dict[str, int],
               prices: dict[str, float] | None = None) -> dict[str, PoolState]:
        """One PoolState per pool seen in heartbeats; ``now`` in seconds."""
        by_pool: dict[str, list[dict[str, Any]]] = {}
        for beat in self.workers():
            by_pool.setdefault(beat["pool"], []).append(beat)
        states = {}
        for pool, beats in by_pool.items():
            alive = [b for b in beats if b["status"] == "UP" and now - b["at"] / 1000 <= self.dead_after_s]
            phases: set[Phase] = set()
            for b in alive or beats:
                phases |= {Phase.PREFILL, Phase.DECODE} if b["phase"] == "BOTH" else {Phase(b["phase"])}
            newest = max(beats, key=lambda b: b["at"])
            states[pool] = PoolState(
                name=pool, alive=bool(alive), phases=frozenset(phases),
                models=frozenset(m for b in beats for m in b["models"]), variant=newest["variant"],
                workers=len(alive), max_batch=max(b["max_batch"] for b in beats) or 1,
                free_kv_bytes=sum(b["kv_free_bytes"] for b in alive),
                worker_free_kv_bytes=max((b["kv_free_bytes"] for b in alive), default=None),
                worker_kv_capacity_bytes=_largest_known(b.get("kv_capacity_bytes") for b in alive),
                kv_format=_one_format(b.get("kv_format") for b in alive or beats),
                queue_requests=sum(b["consumer_lag"] for b in alive), in_flight=in_flight.get(pool, 0),
                recent_failures=failures.get(pool, 0), last_heartbeat=newest["at"] / 1000,
                price_per_hour=(prices or {}).get(pool),
            )
        return states
