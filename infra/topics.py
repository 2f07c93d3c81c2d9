"""Every Kafka topic phaseroute uses, declared once: name, partitions, replication, retention,
compaction, the Avro kind of its values and what keys it.

``provision`` creates what is missing and checks that what exists matches the spec: a
topic with other partitions or another cleanup policy is a ``TopicMismatchError`` naming the
topic, the setting, the expected and the actual value — never silent drift.

Per-pool topics (``prefill.<pool>``, ``decode.<pool>``) are templates instantiated for each
pool that is started.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

DAY_MS = 24 * 3600 * 1000
# Faust tables are co-partitioned with the control-plane streams that feed them; they all
# use this many partitions, and the Faust app's topic_partitions is set to it.
CONTROL_PARTITIONS = 4
POOL_PARTITIONS = 6  # up to 6 workers of one phase can share a pool's work
POOL_NAME = re.compile(r"^[a-z][a-z0-9-]{0,47}$")



class UnknownTopicError(KeyError):
    """A topic name that the spec does not declare."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0])


class TopicMismatchError(RuntimeError):
    """An existing topic differs from the spec."""


@dataclass(frozen=True)
class TopicSpec:
    """One topic as phaseroute expects it to be."""

    name: str
    partitions: int
    value_kind: str  # Avro message kind (schemas/avro/<kind>.avsc)
    key: str  # what the record key is
    doc: str
    compacted: bool = False
    retention_ms: int = 7 * DAY_MS
    replication: int = 1
    copartition_group: str | None = None
    extra_config: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.partitions < 1:
            raise ValueError(f"topic {self.name!r}: partitions must be >= 1, got {self.partitions}")
        if self.replication < 1:
            raise ValueError(f"topic {self.name!r}: replication must be >= 1, got {self.replication}")

    def config(self) -> dict[str, str]:
        """The topic-level configs provisioning sets and checks."""
        cfg = {"cleanup.policy": "compact" if self.compacted else "delete", "retention.ms": str(self.retention_ms)}
        if self.compacted:
            # The cleaner only compacts closed segments, and keeps a deleted key's tombstone for
            # delete.retention.ms after that: with Kafka's defaults (a week's segment, a day's
            # tombstones) the control plane's changelogs grew with every request ever run, and a
            # restart replayed them all (370k records after one test module, at ~5k a second). Segments of a
            # minute and tombstones kept 5 minutes bound a changelog by the live work plus the last
            # minutes; a reader that needs longer than that to read a changelog from the start
            # could miss a delete.
            cfg.update({"segment.ms": str(60_000), "min.cleanable.dirty.ratio": "0.1",
                        "delete.retention.ms": str(300_000)})
        cfg.update(dict(self.extra_config))
        return cfg


# Topic names: every process takes them from here (never a literal of its own).
JOBS_SUBMITTED = "jobs.submitted"
JOBS_COMMANDS = "jobs.commands"
JOBS_EVENTS = "jobs.events"
JOBS_STATE = "jobs.state"
REQUESTS_PENDING = "requests.pending"
KV_READY = "kv.ready"
RESULTS = "results"
RESULTS_WRITTEN = "results.written"
ATTEMPTS_FAILED = "attempts.failed"
TELEMETRY_PHASE = "telemetry.phase"
POOLS_HEARTBEAT = "pools.heartbeat"
PROFILES = "profiles"
CANARY_RESULTS = "canary.results"
TELEMETRY_DRIFT = "telemetry.drift"
QUALITY_ALERTS = "quality.alerts"
DEADLETTER = "deadletter"
TENANTS = "tenants"
CONTROL_LEASE = "control.lease"
JOBS_ADMISSIONS = "jobs.admissions"
CONTROL_LOAD = "control.load"
ADMISSION_GROUP = "phaseroute-admission"  # the admission desks' consumer group on jobs.submitted
TRACKING_GROUP = "phaseroute-tracking"  # the job trackers' consumer group (streams/tracking_loop.py)
TRACKING_CHANGELOG = "phaseroute-tracking-changelog"


def prefill_topic(pool: str) -> str:
    """The topic of prefill (or colocated) work for ``pool``'s workers."""
    return f"prefill.{check_pool_name(pool)}"


def decode_topic(pool: str) -> str:
    """The topic of decode work (KV prefilled elsewhere) for ``pool``'s workers."""
    return f"decode.{check_pool_name(pool)}"


def _control(name: str, kind: str, key: str, doc: str, **kw: object) -> TopicSpec:
    return TopicSpec(name, CONTROL_PARTITIONS, kind, key, doc, copartition_group="control", **kw)  # type: ignore[arg-type]


STATIC_TOPICS: tuple[TopicSpec, ...] = (
    _control(JOBS_SUBMITTED, "job_submitted", "job_id", "Jobs as producers submit them (idempotent by job_id)."),
    _control(JOBS_COMMANDS, "job_command", "job_id", "Operator/tenant commands on a job (cancel)."),
    _control(JOBS_EVENTS, "job_event", "job_id",
             "Every job life-cycle event: admitted, rejected + reason, progress, done.", retention_ms=30 * DAY_MS),
    _control(JOBS_STATE, "job_event", "job_id",
             "Latest event per job (compacted): job state rebuilt after any restart.", compacted=True, retention_ms=-1),
    _control(JOBS_ADMISSIONS, "job_admission", "job_id",
             "Admission desks' verdicts (compacted), for the tracker to take and for the desk that owns the job's "
             "partition to know its id; co-partitioned with jobs.submitted.", compacted=True, retention_ms=-1),
    _control(REQUESTS_PENDING, "request", "tenant", "Admitted requests waiting for the fair scheduler."),
    _control(KV_READY, "kv_ready", "job_id", "Prefill finished: where the KV blob is, its size and checksum."),
    _control(RESULTS, "result", "job_id", "One result per finished attempt (dedup by request_id downstream)."),
    _control(RESULTS_WRITTEN, "output_written", "job_id",
             "The result sink's receipts: a job's output lines fsynced so far; the job completes on them."),
    _control(ATTEMPTS_FAILED, "attempt_failed", "job_id", "A failed attempt (KV corrupt or lost, worker error) for the tracker to retry."),
    TopicSpec(TELEMETRY_PHASE, 2, "phase_telemetry", "pool", "One record per executed batch, for ClickHouse."),
    TopicSpec(POOLS_HEARTBEAT, 1, "pool_heartbeat", "worker_id", "Worker liveness, queue depth, memory.", retention_ms=DAY_MS),
    TopicSpec(PROFILES, 1, "profile_row", "model|phase|pool|variant",
              "Measured profile rows (compacted) the router joins against.", compacted=True, retention_ms=-1),
    TopicSpec(CANARY_RESULTS, 1, "result", "job_id",
              "Results of drift canaries (tenant _canary), for the drift monitor; real results go to results.", retention_ms=DAY_MS),
    TopicSpec(TELEMETRY_DRIFT, 1, "drift_measurement", "model|prefill_pool|decode_pool",
              "Canary drift per path and round (drift monitor), for ClickHouse.", retention_ms=30 * DAY_MS),
    TopicSpec(QUALITY_ALERTS, 1, "quality_alert", "model|prefill_pool|decode_pool",
              "Paths demoted from, or restored to, EXACT-tier work by the drift monitor.", retention_ms=30 * DAY_MS),
    TopicSpec(TENANTS, 1, "tenant", "tenant name",
              "The tenant registry (compacted): weights, quotas and hashed API keys per tenant.", compacted=True, retention_ms=-1),
    TopicSpec(CONTROL_LEASE, 1, "none", "none (no records)",
              "The control plane's lease: the instance its consumer group assigns the one partition to is the "
              "active control plane, the others are standbys (infra/control_lease.py)."),
    TopicSpec(CONTROL_LOAD, 1, "load_snapshot", "the literal 'load'",
              "The active dispatcher's load (backlog per job, fleet rate per model, age-stamped) every second, for the admission desks.",
              compacted=True, retention_ms=DAY_MS),
    TopicSpec(DEADLETTER, 1, "dead_letter", "source topic",
              "Undecodable or invalid messages, each with its reason.", retention_ms=30 * DAY_MS),
)

# The control plane's Faust tables, changelog-backed. Provisioned with the rest (compacted, as many
# partitions as the streams that feed them): on a fresh broker, a changelog Faust creates itself
# may not exist yet when the first table write asks for its partitions.
CONTROL_APP_ID = "phaseroute-control"
CONTROL_LEASE_GROUP = "phaseroute-control-lease"
CONTROL_TABLES = ("jobs", "requests", "tenants", "prompts")


def changelog_topic(table: str) -> str:
    return f"{CONTROL_APP_ID}-{table}-changelog"


CHANGELOG_TOPICS: tuple[TopicSpec, ...] = tuple(
    _control(changelog_topic(t), "faust-json", "table key", f"Changelog of the control plane's {t!r} table (Faust).",
             compacted=True)  # the default retention, as Faust creates it (a compact-only topic never applies it)
    for t in CONTROL_TABLES
) + (
    _control(TRACKING_CHANGELOG, "json", "job_id",
             "The job trackers' state (compacted): each job's latest JobRecord as JSON, on the partition of its "
             "job id; the tracker given a partition reads it back before it reads that partition's inputs.",
             compacted=True),
)

POOL_TOPIC_TEMPLATES: dict[str, tuple[str, str]] = {
    "prefill": ("prefill_work", "Prefill (or colocated) work for the pool's workers; the dispatcher picks the "
                "partition (fewest tokens so far, the same for every attempt: streams/pool_partitions.py)."),
    "decode": ("decode_work", "Decode work (KV already prefilled elsewhere) for the pool's workers."),
}


def check_pool_name(pool: str) -> str:
    if not POOL_NAME.match(pool):
        raise ValueError(f"pool name {pool!r} must match {POOL_NAME.pattern} (lower case, digits, '-')")
    return pool


def pool_topics(pool: str, partitions: int = POOL_PARTITIONS) -> tuple[TopicSpec, ...]:
    """The per-pool work topics of ``pool``."""
    check_pool_name(pool)
    return tuple(
        TopicSpec(f"{phase}.{pool}", partitions, kind, "request_id", doc)
        for phase, (kind, doc) in POOL_TOPIC_TEMPLATES.items()
    )


def prefixed(specs: Iterable[TopicSpec], prefix: str) -> list[TopicSpec]:
    """The specs with every name prefixed (several deployments sharing one cluster)."""
    from dataclasses import replace

    return [replace(s, name=prefix + s.name) for s in specs]


def spec_for(name: str, pools: Sequence[str] = ()) -> TopicSpec:
    """The spec of ``name``; an unknown name is an error listing the known ones."""
    specs = {s.name: s for s in all_topics(pools)}
    if name in specs:
        return specs[name]
    phase, _, pool = name.partition(".")
    if phase in POOL_TOPIC_TEMPLATES and pool:
        return {s.name: s for s in pool_topics(pool)}[name]
    raise UnknownTopicError(
        f"topic {name!r} is not in the phaseroute topic spec; known: "
        + ", ".join(sorted(specs)) + ", and prefill.<pool> / decode.<pool>"
    )


def all_topics(pools: Sequence[str] = ()) -> list[TopicSpec]:
    specs = list(STATIC_TOPICS) + list(CHANGELOG_TOPICS)
    for pool in pools:
        specs.extend(pool_topics(pool))
    check_copartitioning(specs)
    return specs


def partition_of(key: str, partitions: int = CONTROL_PARTITIONS) -> int:
    """The partition a key lands on with the murmur2 partitioner every phaseroute producer uses
    (Faust's aiokafka and confluent-kafka's ``murmur2_random`` agree on it)."""
    from aiokafka.partitioner import murmur2

    return int(murmur2(key.encode()) & 0x7FFFFFFF) % partitions


def check_copartitioning(specs: Iterable[TopicSpec]) -> None:
    """Topics in one co-partition group must have equal partition counts."""
    groups: dict[str, dict[str, int]] = {}
    for s in specs:
        if s.copartition_group:
            groups.setdefault(s.copartition_group, {})[s.name] = s.partitions
    for group, members in groups.items():
        if len(set(members.values())) > 1:
            raise TopicMismatchError(f"co-partition group {group!r} has unequal partition counts: {members}")
