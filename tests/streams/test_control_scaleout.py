"""Admission and tracking scaled out live: `phaseroute control` instances on the real broker
share the partitions of ``jobs.submitted`` (the admission group) and of the topics a job's
tracker reads (the tracking group: ``jobs.admissions``, ``results.written``, ``jobs.commands``,
co-partitioned), one of them dispatches. The fleet is a
FAKE one of instant workers (``consumers/instant_fleet.py``: no model runs; a fleet we do not
have), the result sink and the control plane are real.

(a) two instances: jobs on every partition are judged by the desk that owns the partition, both
    desks judge some, both track the jobs of their partitions (the same partition numbers of the
    three topics each), and every request of every job has exactly one output line;
(c) a third instance joins while jobs run: it is given partitions of both groups, judges the jobs
    submitted there after it joined, and no result is lost or written twice;
and a desk works on its partitions side by side (a small job is not queued behind a big file).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from phaseroute.api.kafka_io import read_latest
from phaseroute.cli.jobs_operator import job_record, publish
from phaseroute.config import settings
from phaseroute.consumers.instant_fleet import InstantFleet
from phaseroute.infra import topics
from phaseroute.infra.group_admin import describe_group
from phaseroute.streams.shell import RESTORED

from .stack_fixture import LiveStack

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
TENANT = "scale"
SESSION_S = 8.0


def _desks(stack: LiveStack) -> dict[str, set[int]]:
    """The process name of each admission desk in the group -> the jobs.submitted partitions it owns."""
    members = describe_group(AdminClient({"bootstrap.servers": stack.bootstrap}), topics.ADMISSION_GROUP, 10).members
    by_pid = {str(p.pid): name for name, p in stack.procs.items()}
    out: dict[str, set[int]] = {}
    for m in members:
        name = by_pid.get(m.client_id.rpartition(":")[2], m.client_id)
        out[name] = {tp.partition for tp in m.assignment.topic_partitions if tp.topic == topics.JOBS_SUBMITTED}
    return out


def _trackers(stack: LiveStack) -> dict[str, set[int]]:
    """The process name of each job tracker in the tracking group -> the partition numbers it
    owns, checked to be the same of the three topics it reads."""
    members = describe_group(AdminClient({"bootstrap.servers": stack.bootstrap}), topics.TRACKING_GROUP, 10).members
    by_pid = {str(p.pid): name for name, p in stack.procs.items()}
    out: dict[str, set[int]] = {}
    for m in members:
        name = by_pid.get(m.client_id.rpartition(":")[2], m.client_id)
        per_topic = {t: {tp.partition for tp in m.assignment.topic_partitions if tp.topic == t}
                     for t in (topics.JOBS_ADMISSIONS, topics.RESULTS_WRITTEN, topics.JOBS_COMMANDS)}
        assert len({frozenset(parts) for parts in per_topic.values()}) == 1, (name, per_topic)
        out[name] = per_topic[topics.JOBS_ADMISSIONS]
    return out


def _wait_trackers(stack: LiveStack, names: set[str], timeout_s: float = 90.0) -> dict[str, set[int]]:
    deadline = time.monotonic() + timeout_s
    trackers: dict[str, set[int]] = {}
    while time.monotonic() < deadline:
        stack.check()
        trackers = _trackers(stack)
        if set(trackers) == names and all(trackers.values()):
            return trackers
        time.sleep(0.5)
    raise AssertionError(f"tracking group: {trackers}, expected {sorted(names)} each with partitions; logs in {stack.logs}")


def _wait_desks(stack: LiveStack, names: set[str], timeout_s: float = 90.0) -> dict[str, set[int]]:
    deadline = time.monotonic() + timeout_s
    desks: dict[str, set[int]] = {}
    while time.monotonic() < deadline:
        stack.check()
        desks = _desks(stack)
        if set(desks) == names and all(desks.values()):
            return desks
        time.sleep(0.5)
    raise AssertionError(f"admission group: {desks}, expected {sorted(names)} each with partitions; logs in {stack.logs}")


def _wait_line(stack: LiveStack, name: str, needle: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stack.check()
        log = stack.logs / f"{name}.log"
        if log.exists() and needle in log.read_text(errors="replace"):
            return
        time.sleep(0.5)
    raise AssertionError(f"{needle!r} not in {name}'s log after {timeout_s:.0f} s; logs in {stack.logs}")


def _job_on(partition: int, tag: str) -> str:
    n = 0
    while topics.partition_of(f"{tag}-{n}") != partition:
        n += 1
    return f"{tag}-{n}"


def _submit(tmp: Path, job_id: str, n: int, deadline: float | None = None) -> None:
    path = tmp / f"{job_id}.jsonl"
    path.write_text("".join(json.dumps({
        "custom_id": f"{job_id}-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "smollm2-135m", "max_tokens": 1, "messages": [{"role": "user", "content": f"Item {i}."}]},
    }) + "\n" for i in range(n)))
    record = job_record(path, TENANT, 1, deadline or time.time() + 3600, job_id, "exact", "smollm2-135m", 1, None,
                        settings().blob_store)
    publish(settings().bootstrap_servers, topics.JOBS_SUBMITTED, job_id, "job_submitted", record)


def _output_ids(job_id: str) -> Counter:
    from phaseroute.consumers.output_file import iter_part_lines
    from phaseroute.infra.blobstore import open_blob_store, output_prefix

    store = open_blob_store(settings().blob_store)
    return Counter(line["custom_id"] for line in iter_part_lines(store, output_prefix(TENANT, job_id)))


def _judged_by(stack: LiveStack) -> dict[str, str]:
    """Job id -> the process name of the desk whose verdict is on jobs.admissions."""
    by_pid = {str(p.pid): name for name, p in stack.procs.items()}
    verdicts = read_latest(stack.bootstrap, topics.JOBS_ADMISSIONS, "job_admission", lambda r: r["job_id"])
    return {j: by_pid.get(r["desk"].rpartition(":")[2], r["desk"]) for j, r in verdicts.items()}


def _all_complete_once(stack: LiveStack, jobs: dict[str, int]) -> None:
    for job_id, n in jobs.items():
        event = stack.wait_job(job_id, 300)
        assert event["state"] == "COMPLETED" and event["requests_done"] == n, event
        assert _output_ids(job_id) == Counter({f"{job_id}-{i}": 1 for i in range(n)}), job_id


@pytest.fixture(scope="module")
def stack(bootstrap: str, tmp_path_factory: pytest.TempPathFactory):
    os.environ["PHASEROUTE_CONTROL_SESSION_TIMEOUT_S"] = str(SESSION_S)
    live = LiveStack(bootstrap, tmp_path_factory.mktemp("scaleout-stack"))
    fleet = InstantFleet(bootstrap, 2, prefix="fake-scaleout")
    try:
        live.start("results", "sink", "results")
        fleet.start()
        live.start("control-a", "control")
        _wait_line(live, "control-a", RESTORED)  # control-a dispatches
        live.start("control-b", "control")
        _wait_desks(live, {"control-a", "control-b"})
        time.sleep(3.0)  # the desks' pool views have the fake pools' heartbeats
        yield live
    finally:
        fleet.stop()
        live.stop_all()
        os.environ.pop("PHASEROUTE_CONTROL_SESSION_TIMEOUT_S", None)


def test_two_instances_judge_the_jobs_of_their_partitions_and_every_request_has_one_line(
        stack: LiveStack, tmp_path: Path) -> None:
    desks = _wait_desks(stack, {"control-a", "control-b"})
    trackers = _wait_trackers(stack, {"control-a", "control-b"})
    assert sorted(p for parts in trackers.values() for p in parts) == list(range(topics.CONTROL_PARTITIONS))
    tag = f"two-{uuid.uuid4().hex[:6]}"
    jobs = {_job_on(p, tag): 300 for p in range(topics.CONTROL_PARTITIONS)}
    for job_id, n in jobs.items():
        _submit(tmp_path, job_id, n)
    _all_complete_once(stack, jobs)

    judged = _judged_by(stack)
    owner = {p: name for name, parts in desks.items() for p in parts}
    assert {j: judged[j] for j in jobs} == {j: owner[topics.partition_of(j)] for j in jobs}, (judged, desks)
    assert set(judged[j] for j in jobs) == {"control-a", "control-b"}  # both instances admitted jobs
    # both tracked jobs to COMPLETED: a partition's jobs are tracked only by its owner in the group
    assert _trackers(stack) == trackers, "the tracking partitions did not move while the jobs ran"


def test_a_third_instance_joins_mid_job_gets_partitions_and_loses_or_duplicates_nothing(
        stack: LiveStack, tmp_path: Path) -> None:
    tag = f"join-{uuid.uuid4().hex[:6]}"
    running = {_job_on(p, f"{tag}-early"): 2000 for p in range(2)}
    for job_id, n in running.items():
        _submit(tmp_path, job_id, n)
    stack.wait_job(next(iter(running)), 120, final=False, done_at_least=50)  # the jobs are running

    stack.start("control-c", "control")
    desks = _wait_desks(stack, {"control-a", "control-b", "control-c"})
    trackers = _wait_trackers(stack, {"control-a", "control-b", "control-c"})
    assert sorted(p for parts in trackers.values() for p in parts) == list(range(topics.CONTROL_PARTITIONS))
    later = {_job_on(p, f"{tag}-late"): 200 for p in range(topics.CONTROL_PARTITIONS)}
    for job_id, n in later.items():
        _submit(tmp_path, job_id, n)
    _all_complete_once(stack, {**running, **later})

    judged = _judged_by(stack)
    assert any(judged[j] == "control-c" for j in later), (judged, desks)  # it judges the jobs of its partitions
    owner = {p: name for name, parts in desks.items() for p in parts}
    assert {j: judged[j] for j in later} == {j: owner[topics.partition_of(j)] for j in later}


def test_a_desk_judges_a_small_job_while_a_big_ones_input_is_read_on_another_partition(
        stack: LiveStack, tmp_path: Path) -> None:
    """The partitions a desk owns are worked on side by side: a small job is not queued behind
    the intake of a big file. (The big job's deadline is already past: it is read and counted
    whole, then rejected, so nothing of it runs.)"""
    desks = _desks(stack)  # two or three instances, four partitions: one desk owns two or more
    first, second = sorted(next(parts for parts in desks.values() if len(parts) >= 2))[:2]
    tag = f"side-{uuid.uuid4().hex[:6]}"
    big, small = _job_on(first, f"{tag}-big"), _job_on(second, f"{tag}-small")
    _submit(tmp_path, big, 40_000, deadline=time.time() - 60)
    time.sleep(0.5)  # its intake has begun
    _submit(tmp_path, small, 5)
    _all_complete_once(stack, {small: 5})
    assert stack.wait_job(big, 120)["state"] == "REJECTED"
    verdicts = read_latest(stack.bootstrap, topics.JOBS_ADMISSIONS, "job_admission", lambda r: r["job_id"])
    assert verdicts[small]["desk"] == verdicts[big]["desk"]  # one desk judged both
    assert verdicts[small]["at"] < verdicts[big]["at"], "the small job waited for the big one's intake"
