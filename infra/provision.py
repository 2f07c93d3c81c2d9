"""Create the topics of the spec on a cluster, idempotently, and verify existing ones match.

``provision(bootstrap, specs)`` is safe to run any number of times: missing topics are
created, matching ones left alone, mismatching ones reported (all of them, in one error).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic  # type: ignore[attr-defined]  # re-exported, not listed

from phaseroute.infra.kafka_security import with_cluster_config
from phaseroute.infra.topics import TopicMismatchError, TopicSpec

CHECKED_CONFIGS = ("cleanup.policy", "retention.ms")


@dataclass(frozen=True)
class TopicState:
    """A topic as the cluster has it."""

    name: str
    partitions: int
    replication: int
    config: dict[str, str]


def admin_client(bootstrap: str) -> AdminClient:
    # log_level 4: librdkafka's warnings and errors, not its notices (a "Purging 1 unserved
    # events" line at every `phaseroute up` told a user nothing)
    return AdminClient(with_cluster_config({"bootstrap.servers": bootstrap, "log_level": 4}))


def describe(admin: AdminClient, names: Sequence[str], timeout_s: float = 15.0) -> dict[str, TopicState]:
    """Partitions, replication and checked configs of those ``names`` that exist."""
    metadata = admin.list_topics(timeout=timeout_s).topics
    present = [n for n in names if n in metadata and metadata[n].error is None]
    if not present:
        return {}
    futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, n) for n in present])
    states = {}
    for resource, future in futures.items():
        entries = future.result(timeout=timeout_s)
        topic = metadata[resource.name]
        first = next(iter(topic.partitions.values()))
        states[resource.name] = TopicState(
            name=resource.name,
            partitions=len(topic.partitions),
            replication=len(first.replicas),
            config={k: entries[k].value for k in CHECKED_CONFIGS if k in entries},
        )
    return states


def mismatches(spec: TopicSpec, state: TopicState) -> list[str]:
    """Human-readable differences between a spec and the topic the cluster has."""
    problems = []
    if state.partitions != spec.partitions:
        problems.append(f"{spec.name}: partitions expected {spec.partitions}, cluster has {state.partitions}")
    if state.replication != spec.replication:
        problems.append(f"{spec.name}: replication expected {spec.replication}, cluster has {state.replication}")
    wanted = spec.config()
    for key in CHECKED_CONFIGS:
        if key in state.config and state.config[key] != wanted[key]:
            problems.append(f"{spec.name}: {key} expected {wanted[key]!r}, cluster has {state.config[key]!r}")
    return problems


def provision(bootstrap: str, specs: Sequence[TopicSpec], timeout_s: float = 30.0) -> list[str]:
    """Create missing topics; raise TopicMismatchError listing every existing topic that differs.

    Returns the names of the topics created by this call.
    """
    admin = admin_client(bootstrap)
    existing = describe(admin, [s.name for s in specs], timeout_s)
    problems = [p for s in specs if s.name in existing for p in mismatches(s, existing[s.name])]
    if problems:
        raise TopicMismatchError("existing topics differ from the phaseroute spec:\n  " + "\n  ".join(problems))
    missing = [s for s in specs if s.name not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [NewTopic(s.name, num_partitions=s.partitions, replication_factor=s.replication, config=s.config()) for s in missing],
        operation_timeout=timeout_s,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":  # a concurrent provision won the race
                raise
    return created
