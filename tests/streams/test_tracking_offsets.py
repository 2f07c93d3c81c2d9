"""Where the tracking loop commits: after the last record handled, held back at a record that
waits in the tracker for its job's verdict until the verdict comes or the tracker drops it."""

from phaseroute.streams.tracking_offsets import CommitPositions


def _due(positions: CommitPositions) -> list[tuple[str, int, int]]:
    return [(tp.topic, tp.partition, tp.offset) for tp in positions.due()]


def test_a_record_waiting_for_its_verdict_holds_its_partition_back() -> None:
    positions = CommitPositions()
    for offset in range(3):
        positions.handled("written", 1, offset)
    positions.waiting("written", 1, 1, "job-a", now=100.0)
    positions.handled("commands", 1, 7)
    assert _due(positions) == [("commands", 1, 8), ("written", 1, 1)]
    positions.committed(positions.due())
    assert _due(positions) == []  # nothing moved since
    assert positions.waiting_jobs([1]) == {"job-a"} and positions.waiting_jobs([0]) == set()

    positions.settle(lambda job_id: False, now=101.0, ttl_s=600.0)
    assert _due(positions) == []  # still waiting
    positions.settle(lambda job_id: job_id == "job-a", now=102.0, ttl_s=600.0)
    assert _due(positions) == [("written", 1, 3)]


def test_a_record_the_tracker_dropped_holds_nothing_and_a_moved_partition_is_forgotten() -> None:
    positions = CommitPositions()
    positions.handled("written", 2, 5)
    positions.waiting("written", 2, 5, "job-b", now=100.0)
    positions.settle(lambda job_id: False, now=701.0, ttl_s=600.0)  # dropped by the tracker after its TTL
    assert _due(positions) == [("written", 2, 6)]

    from confluent_kafka import TopicPartition

    positions.forget([TopicPartition("written", 2)])
    assert _due(positions) == []
