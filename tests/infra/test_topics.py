"""The declarative topic spec: co-partitioning, unknown names, pool topics."""

import pytest

from phaseroute.infra import topics


def test_control_topics_are_copartitioned_with_the_faust_app() -> None:
    control = [s for s in topics.all_topics(["gpu-a"]) if s.copartition_group == "control"]
    assert {s.partitions for s in control} == {topics.CONTROL_PARTITIONS}
    assert {"jobs.submitted", "jobs.events", "jobs.state", "requests.pending"} <= {s.name for s in control}


def test_state_topics_are_compacted_and_kept() -> None:
    for name in ("jobs.state", "profiles"):
        spec = topics.spec_for(name)
        assert spec.config()["cleanup.policy"] == "compact"
        assert spec.config()["retention.ms"] == "-1"
    assert topics.spec_for("jobs.events").config()["cleanup.policy"] == "delete"


def test_unequal_partitions_in_a_copartition_group_is_an_error() -> None:
    bad = [
        topics.TopicSpec("a", 4, "request", "k", "doc", copartition_group="g"),
        topics.TopicSpec("b", 2, "request", "k", "doc", copartition_group="g"),
    ]
    with pytest.raises(topics.TopicMismatchError, match=r"'g' has unequal partition counts: \{'a': 4, 'b': 2\}"):
        topics.check_copartitioning(bad)


def test_unknown_topic_names_the_known_ones() -> None:
    with pytest.raises(topics.UnknownTopicError) as err:
        topics.spec_for("jobs.submited")
    assert "'jobs.submited' is not in the phaseroute topic spec" in str(err.value)
    assert "jobs.submitted" in str(err.value)


def test_pool_topics_are_templated_and_pool_names_checked() -> None:
    assert [s.name for s in topics.pool_topics("int8-cpu")] == ["prefill.int8-cpu", "decode.int8-cpu"]
    assert topics.spec_for("decode.fp32").value_kind == "decode_work"
    with pytest.raises(ValueError, match="pool name 'Bad Pool'"):
        topics.pool_topics("Bad Pool")


def test_bad_partition_count_names_the_topic() -> None:
    with pytest.raises(ValueError, match="topic 'x': partitions must be >= 1, got 0"):
        topics.TopicSpec("x", 0, "request", "k", "doc")


def test_every_topic_name_constant_is_a_declared_topic() -> None:
    # the module's upper-case strings are topic names, but for the group and app ids (and the
    # tracking changelog named after its group), which all start with "phaseroute-"
    names = {value for key, value in vars(topics).items()
             if key.isupper() and isinstance(value, str) and not value.startswith("phaseroute-")}
    assert len(names) >= 20
    assert names <= {s.name for s in topics.STATIC_TOPICS}, names - {s.name for s in topics.STATIC_TOPICS}
    assert topics.prefill_topic("gpu-a") == "prefill.gpu-a" and topics.decode_topic("gpu-a") == "decode.gpu-a"
    assert {topics.prefill_topic("gpu-a"), topics.decode_topic("gpu-a")} == {s.name for s in topics.pool_topics("gpu-a")}
    with pytest.raises(ValueError, match="Bad_Pool"):
        topics.decode_topic("Bad_Pool")
