"""Provisioning against the real broker: idempotent, and drift is an error."""

import dataclasses
import uuid

import pytest
from confluent_kafka.admin import AdminClient

from phaseroute.infra import provision, topics

pytestmark = pytest.mark.kafka


def _spec(name: str, partitions: int, compacted: bool = False) -> topics.TopicSpec:
    return topics.TopicSpec(name, partitions, "request", "k", "test topic", compacted=compacted)


def test_provision_creates_then_is_idempotent(bootstrap: str) -> None:
    name = f"test.prov.{uuid.uuid4().hex[:8]}"
    specs = [_spec(name, 3, compacted=True)]
    try:
        assert provision.provision(bootstrap, specs) == [name]
        assert provision.provision(bootstrap, specs) == []
        state = provision.describe(provision.admin_client(bootstrap), [name])[name]
        assert (state.partitions, state.replication) == (3, 1)
        assert state.config["cleanup.policy"] == "compact"
    finally:
        admin = AdminClient({"bootstrap.servers": bootstrap})  # keep a reference until the future resolves
        admin.delete_topics([name])[name].result(timeout=30)


def test_existing_topic_with_other_partitions_is_a_clear_error(bootstrap: str, make_topic) -> None:
    name = make_topic("mismatch", partitions=2)
    with pytest.raises(topics.TopicMismatchError) as err:
        provision.provision(bootstrap, [_spec(name, 4, compacted=True)])
    message = str(err.value)
    assert f"{name}: partitions expected 4, cluster has 2" in message
    assert f"{name}: cleanup.policy expected 'compact', cluster has 'delete'" in message


def test_the_running_cluster_matches_the_whole_spec(bootstrap: str) -> None:
    # ./dev.sh test ran `phaseroute up`, which provisioned the spec; it must still match
    assert provision.provision(bootstrap, topics.all_topics()) == []


def test_a_changelog_faust_created_itself_matches_the_spec(bootstrap: str, make_topic) -> None:
    # a broker that ran the control plane before changelogs were provisioned: Faust made them
    # compacted, at the table's partitions, with the broker's default retention
    name = make_topic("changelog", partitions=topics.CONTROL_PARTITIONS, config={"cleanup.policy": "compact"})
    assert provision.provision(bootstrap, [dataclasses.replace(topics.CHANGELOG_TOPICS[0], name=name)]) == []
