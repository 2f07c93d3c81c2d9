"""The profile builder: ClickHouse telemetry -> policy rows -> the compacted ``profiles`` topic.

Life of a profile row: workers emit ``phase_telemetry``; the telemetry sink inserts it into
ClickHouse; every ``interval_s`` the builder (inside the telemetry service, which owns the
embedded chdb) gathers the window's aggregates with SQL (``aggregates_sql``), lets the policy
turn them into TELEMETRY rows and links (``build_profile_rows``, ``build_link_profiles``),
and publishes each as a ``profile_row`` record. The newest ``engine_profile`` run of each
pool becomes PROFILER rows the same way (``convert.profiler_rows``). A record is published
only when it differs from what this builder last published under its key: a new profile run
is published once, and a quiet fleet publishes nothing, so its rows age on the topic and the
router's confidence in them decays. The topic is compacted; each record replaces its key.

Figures telemetry cannot measure are copied from the pool's PROFILER row, so blending leaves
them as they were: memory bytes per token always, KV bytes per token when neither a batch nor
a transfer of the pool's KV reported bytes (without a PROFILER row: KV bytes, else 0).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from phaseroute.infra import topics
from phaseroute.schemas import serde
from phaseroute.streams.policy import (
    LinkProfile,
    PhaseAggregate,
    ProfileBuilderConfig,
    ProfileRow,
    build_link_profiles,
    build_profile_rows,
)
from phaseroute.streams.policy.types import RowKey
from phaseroute.streams.profiles import aggregates_sql as sql
from phaseroute.streams.profiles.convert import link_to_avro, profiler_rows, record_key, row_to_avro

log = logging.getLogger(__name__)


class Producer(Protocol):
    """What the builder needs of ``consumers.kafka_clients.TrackedProducer``."""

    def produce(self, topic: str, key: str | bytes | None, value: bytes) -> None: ...

    def flush_or_raise(self, timeout_s: float = 30.0) -> None: ...


@dataclass(frozen=True)
class BuilderConfig:
    topic: str = topics.PROFILES
    """Topic the records go to (tests use their own)."""
    interval_s: float = 5.0
    """Seconds between builds when run from ``on_tick``."""
    window_s: float = 900.0
    """Telemetry older than this is ignored (seconds)."""
    tau_s: float = 60.0
    """Decay constant of the sample weights ``exp(-age / tau_s)`` (seconds). At 300 s, a pool
    slowed 4x at run time still looked half as fast as before two minutes later (the minute of
    fast batches before the slowdown kept ~70% of its weight), and its share of new work stayed
    at 0.40-0.43 (``tests/streams/test_adaptation.py``); at 60 s that minute weighs under 20%."""
    policy: ProfileBuilderConfig = field(default_factory=ProfileBuilderConfig)
    """Passed to the policy's ``build_profile_rows`` / ``build_link_profiles``."""
    publish_profiler: bool = True
    """Also publish PROFILER rows from ``engine_profile`` (cold start)."""

    def __post_init__(self) -> None:
        for name in ("interval_s", "window_s", "tau_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"BuilderConfig.{name} must be a finite positive number of seconds, got {value!r}")
        if not self.topic:
            raise ValueError("BuilderConfig.topic must not be empty")


class ProfileBuilder:
    """Builds and publishes profile records from one ClickHouse database."""

    def __init__(self, client: Any, producer: Producer, database: str, config: BuilderConfig | None = None) -> None:
        self.client = client
        self.producer = producer
        self.database = sql.check_database(database)
        self.config = config or BuilderConfig()
        self._published: dict[str, dict[str, Any]] = {}
        self._next_at = 0.0
        self.stats = {"builds": 0, "published": 0, "failures": 0}

    # -- one build ------------------------------------------------------------------------
    def build_once(self, now: float) -> list[dict[str, Any]]:
        """Gather, build, publish (changed records only); return the records published."""
        profiler = profiler_rows(sql.latest_profile_runs(self.client, self.database), now)
        rows, links = self.telemetry_rows(now, {r.key: r for r in profiler})
        cfg = self.config
        records = [row_to_avro(r, cfg.window_s, quality_measured=False) for r in rows]
        records += [link_to_avro(link, cfg.window_s) for link in links]
        if cfg.publish_profiler:
            records += [row_to_avro(r, 0.0, quality_measured=False) for r in profiler]
        self.stats["builds"] += 1
        return self._publish(records)

    def telemetry_rows(
        self, now: float, profiler: Mapping[RowKey, ProfileRow] | None = None
    ) -> tuple[list[ProfileRow], list[LinkProfile]]:
        """TELEMETRY rows and links of the window ending at ``now`` (nothing published);
        ``profiler`` maps a row key to its PROFILER row (figures telemetry cannot measure)."""
        window = sql.Window(now, self.config.window_s, self.config.tau_s)
        source_kv = sql.source_kv_per_token(self.client, self.database, window)
        aggregates = [
            _fill(m, source_kv, (profiler or {}).get(m.aggregate.key))
            for m in sql.phase_aggregates(self.client, self.database, window)
        ]
        rows = build_profile_rows(aggregates, now, self.config.policy)
        links = build_link_profiles(sql.link_aggregates(self.client, self.database, window), now, self.config.policy)
        return rows, links

    def _publish(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        changed = {}
        for record in records:
            key = record_key(record)
            if not _same(self._published.get(key), record):
                changed[key] = record
        for key, record in changed.items():
            self.producer.produce(self.config.topic, key, serde.encode("profile_row", record))
        if changed:
            self.producer.flush_or_raise()  # only acknowledged records count as published
            self._published.update(changed)
            self.stats["published"] += len(changed)
        return list(changed.values())

    # -- running inside the telemetry service ----------------------------------------------
    def on_tick(self, _loop: object = None) -> None:
        """``WorkerLoop`` hook: build when ``interval_s`` has passed since the last build. A
        failed build is logged and counted, and retried at the next interval (the sink goes on)."""
        now = time.time()
        if now < self._next_at:
            return
        self._next_at = now + self.config.interval_s
        try:
            published = self.build_once(now)
        except Exception:  # ClickHouse or Kafka trouble must not stop the telemetry sink
            self.stats["failures"] += 1
            log.exception("profile build failed (%d so far); retrying in %.0f s", self.stats["failures"], self.config.interval_s)
            return
        if published:
            log.info("published %d profile record(s) to %s", len(published), self.config.topic)


def _same(a: Any, b: Any) -> bool:
    """Equal records, floats to 1e-9 (moving ``now`` rescales every decay weight alike, which
    leaves the weighted means equal only up to rounding)."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _fill(measured: sql.Measured, source_kv: Mapping[tuple[str, str], float], prior: ProfileRow | None) -> PhaseAggregate:
    agg = measured.aggregate
    kv = measured.kv_bytes_per_token
    if kv is None:
        kv = source_kv.get((agg.model, agg.pool))
    if kv is None:
        kv = prior.kv_bytes_per_token if prior else 0.0
    mem = prior.mem_bytes_per_token if prior else kv
    return replace(agg, kv_bytes_per_token=kv, mem_bytes_per_token=mem)


def service_builder(client: Any, bootstrap: str, database: str, config: BuilderConfig | None = None) -> ProfileBuilder:
    """A builder with its own idempotent, murmur2-partitioned producer (for the telemetry service)."""
    from phaseroute.consumers.kafka_clients import TrackedProducer

    producer = TrackedProducer(bootstrap, f"profile-builder.{os.getpid()}")
    return ProfileBuilder(client, producer, database, config)
