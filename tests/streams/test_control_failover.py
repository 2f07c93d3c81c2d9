"""Control-plane fail-over live: two `phaseroute control` instances on the real broker, one
active (it holds the control lease), one standby; real workers and the real model.

One job of a flooding tenant runs through it all:
- the active instance is killed (SIGKILL) mid-job: the standby takes over (the lease moves to it
  once the dead one's session expired) and the job goes on from the changelog tables;
- a third instance joins mid-job: the lease does not move (cooperative-sticky assignment);
- the job completes with exactly one output line per request, and the flooding tenant's VTC
  counter (the tenants table) went on from where it was, it was not reset.
The fail-over times are printed (`pytest -s`).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from phaseroute.config import settings
from phaseroute.infra import topics
from phaseroute.infra.control_lease import lease_members

from .stack_fixture import CLI, LiveStack, profile_pools
from .test_live_control import _input_file

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.slow]
POOL = "itest-failover"
TENANT = "flood"
SESSION_S = 8.0  # the control plane's session timeout in this test (PHASEROUTE_CONTROL_SESSION_TIMEOUT_S)


def _active(stack: LiveStack) -> tuple[str, str | None]:
    """(the active instance's client id, the name of its process in ``stack``)."""
    members = lease_members(stack.bootstrap)
    active = next((m.client_id for m in members if m.active), "")
    pid = active.rpartition(":")[2]
    name = next((n for n, p in stack.procs.items() if str(p.pid) == pid), None)
    return active, name


def _wait_active(stack: LiveStack, other_than: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        active, _ = _active(stack)
        if active and active != other_than:
            return active
        time.sleep(0.2)
    raise AssertionError(f"no instance took the control lease over from {other_than} in {timeout_s:.0f} s; "
                         f"members: {lease_members(stack.bootstrap)}; logs in {stack.logs}")


def _vtc_counters(bootstrap: str, tenant: str) -> list[tuple[int, float]]:
    """(changelog offset, VTC counter) of every write of the tenant's counter to the control
    plane's ``tenants`` table, oldest first."""
    topic = topics.changelog_topic("tenants")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"itest-vtc-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        writes, open_parts = [], set(parts)
        while open_parts:
            msg = consumer.poll(5.0)
            if msg is None:
                break
            if msg.error():
                open_parts.discard(msg.partition())
                continue
            if msg.key() is not None and json.loads(msg.key()) == tenant and msg.value() is not None:
                writes.append((msg.offset(), float(json.loads(msg.value())["counter"])))
        return sorted(writes)
    finally:
        consumer.close()


def _output_ids(job_id: str) -> Counter:
    from phaseroute.consumers.output_file import iter_part_lines
    from phaseroute.infra.blobstore import open_blob_store, output_prefix

    store = open_blob_store(settings().blob_store)
    return Counter(line["custom_id"] for line in iter_part_lines(store, output_prefix(TENANT, job_id)))


@pytest.fixture(scope="module")
def stack(bootstrap: str, tmp_path_factory: pytest.TempPathFactory):
    profile_pools({POOL: "fp32"})
    os.environ["PHASEROUTE_CONTROL_SESSION_TIMEOUT_S"] = str(SESSION_S)
    live = LiveStack(bootstrap, tmp_path_factory.mktemp("failover-stack"))
    try:
        live.start("telemetry", "sink", "telemetry")
        live.start("results", "sink", "results")
        live.start("control-a", "control")
        live.start("control-b", "control")
        live.worker(POOL, "both", "fp32", "--max-decode-batch", "8")
        live.wait_ready([POOL])
        yield live
    finally:
        live.stop_all()
        os.environ.pop("PHASEROUTE_CONTROL_SESSION_TIMEOUT_S", None)


def test_standby_takes_over_from_a_killed_active_instance_and_the_job_completes_once(stack: LiveStack,
                                                                                   tmp_path: Path) -> None:
    job_id = f"failover-{uuid.uuid4().hex[:8]}"
    n = 40
    proc = subprocess.run([*CLI, "submit", str(_input_file(tmp_path / f"{job_id}.jsonl", n)), "--tenant", TENANT,
                           "--deadline", "30m", "--job-id", job_id], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    before = stack.wait_job(job_id, 400, final=False, done_at_least=8)
    first, first_name = _active(stack)
    assert first_name in ("control-a", "control-b"), f"the lease holder {first!r} is none of this test's instances"


    killed_at = time.monotonic()
    stack.stop(first_name, kill=True)  # SIGKILL: no graceful shutdown, the lease is not given back
    written = _vtc_counters(stack.bootstrap, TENANT)  # the dead instance wrote its last counter by now
    assert written and written[-1][1] > 0, f"the flooding tenant's VTC counter was never written: {written}"
    last_offset, counter_before = written[-1]
    second = _wait_active(stack, other_than=first, timeout_s=SESSION_S + 30)
    lease_s = time.monotonic() - killed_at
    progressed = stack.wait_job(job_id, 300, final=False, done_at_least=before["requests_done"] + 1)
    progress_s = time.monotonic() - killed_at
    print(f"\nfail-over: lease moved {first} -> {second} {lease_s:.1f} s after the kill "
          f"(session timeout {SESSION_S:.0f} s); the job progressed again after {progress_s:.1f} s "
          f"({before['requests_done']} -> {progressed['requests_done']} done)")

    stack.start("control-c", "control")  # a third instance joins mid-job: the lease stays where it is
    time.sleep(SESSION_S)
    assert _active(stack)[0] == second, f"the lease moved when an instance joined: {lease_members(stack.bootstrap)}"

    event = stack.wait_job(job_id, 600)
    assert event["state"] == "COMPLETED" and event["requests_done"] == n, event
    assert _output_ids(job_id) == Counter({f"q{i}": 1 for i in range(n)})
    after = [c for offset, c in _vtc_counters(stack.bootstrap, TENANT) if offset > last_offset]
    assert after, "the new active instance never wrote the flooding tenant's counter"
    assert min(after) >= counter_before, (f"the VTC counter of {TENANT} was {counter_before} when the active "
                                          f"instance died and {min(after)} in the new one's writes: it was reset")
    roles = {m.client_id: m.active for m in lease_members(stack.bootstrap)}
    assert sum(roles.values()) == 1 and len(roles) == 2, f"one active and one standby expected: {roles}"
