"""What ``phaseroute pools`` says about the control plane, from the broker alone.

* instances: the members of the control lease group (``infra/control_lease.py``); the one
  holding the lease is ``active`` (it dispatches), the rest are ``standby``;
* each instance's admission desk: the ``jobs.submitted`` partitions the admission group
  (``phaseroute-admission``) gives it, and the submissions not judged yet (``admission_lag``);
* each instance's job tracker: the partitions the tracking group (``phaseroute-tracking``) gives
  it (the same numbers of ``jobs.admissions``, ``results.written`` and ``jobs.commands``), and the
  records of those topics it has not handled yet (``tracking_lag``);
* partitions: what the active instance's Faust consumer (group ``phaseroute-control``) is
  assigned, per topic (the dispatcher owns every partition of the topics it reads);
* lag: the control inputs the Faust group has not committed yet (broker watermarks);
* load: the dispatcher's last load snapshot on ``control.load``, what the admission desks judge
  against: its age, the requests queued, the jobs open and the fleet's rate per model.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from phaseroute.infra import topics
from phaseroute.infra.control_lease import lease_members
from phaseroute.infra.group_admin import describe_group
from phaseroute.schemas.deadletter import Rejected, safe_decode

# what the control plane consumes (its Faust agents' topics)
CONTROL_INPUTS = (topics.JOBS_ADMISSIONS, topics.REQUESTS_PENDING, topics.KV_READY, topics.RESULTS,
                  topics.ATTEMPTS_FAILED, topics.RESULTS_WRITTEN, topics.JOBS_COMMANDS, topics.CANARY_RESULTS)
TRACKING_INPUTS = (topics.JOBS_ADMISSIONS, topics.RESULTS_WRITTEN, topics.JOBS_COMMANDS)  # streams/tracking_loop.py


def control_report(admin: AdminClient, consumer: Consumer, bootstrap: str, timeout_s: float) -> dict[str, Any]:
    """{"active", "instances": [{"instance", "host", "role"}], "partitions": {topic: [..]}, "lag", "lag_by_topic",
    "load"}."""
    from phaseroute.cli.pools_cmd import group_lag

    members = lease_members(bootstrap, timeout_s)
    active = next((m.client_id for m in members if m.active), None)
    group = describe_group(admin, topics.CONTROL_APP_ID, timeout_s)
    partitions: dict[str, list[int]] = defaultdict(list)
    for m in group.members:
        for tp in (m.assignment.topic_partitions if m.assignment else []):
            partitions[tp.topic].append(tp.partition)
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    lag = group_lag(admin, consumer, topics.CONTROL_APP_ID, [t for t in CONTROL_INPUTS if t in existing], timeout_s)
    desks = _member_partitions(admin, topics.ADMISSION_GROUP, timeout_s)
    admission_lag = group_lag(admin, consumer, topics.ADMISSION_GROUP, [topics.JOBS_SUBMITTED], timeout_s)
    trackers = _member_partitions(admin, topics.TRACKING_GROUP, timeout_s)
    tracking_lag = group_lag(admin, consumer, topics.TRACKING_GROUP, [t for t in TRACKING_INPUTS if t in existing], timeout_s)
    return {
        "active": active,
        "instances": [{"instance": m.client_id, "host": m.host, "role": "active" if m.active else "standby",
                       "admission_partitions": desks.get(m.client_id, []),
                       "tracking_partitions": trackers.get(m.client_id, [])} for m in members],
        "admission_lag": sum(admission_lag.values()), "tracking_lag": sum(tracking_lag.values()),
        "partitions": {t: sorted(p) for t, p in sorted(partitions.items())},
        "lag": sum(lag.values()), "lag_by_topic": lag,
        "load": latest_load(consumer, timeout_s) if topics.CONTROL_LOAD in existing else None,
    }


def _member_partitions(admin: AdminClient, group: str, timeout_s: float) -> dict[str, list[int]]:
    """Client id of each member of ``group`` -> the partition numbers it is assigned (over all topics)."""
    return {m.client_id: sorted({tp.partition for tp in (m.assignment.topic_partitions if m.assignment else [])})
            for m in describe_group(admin, group, timeout_s).members}


def latest_load(consumer: Consumer, timeout_s: float) -> dict[str, Any] | None:
    """The newest record of ``control.load`` (one partition), summed up; None when there is none
    or it does not decode."""
    low, high = consumer.get_watermark_offsets(TopicPartition(topics.CONTROL_LOAD, 0), timeout=timeout_s)
    if high <= low:
        return None
    consumer.assign([TopicPartition(topics.CONTROL_LOAD, 0, high - 1)])
    try:
        msg = consumer.poll(timeout_s)
    finally:
        consumer.unassign()
    if msg is None or msg.error():
        return None
    now = time.time()  # the snapshot's age as of reading it
    decoded = safe_decode(msg.value(), msg.key(), topic=topics.CONTROL_LOAD, partition=0, offset=msg.offset() or 0,
                          service="pools", now_ms=int(now * 1000), expected_kind="load_snapshot")
    if isinstance(decoded, Rejected):
        return None
    r = decoded.record
    return {
        "dispatcher": r["dispatcher"], "age_s": round(now - r["at"] / 1000, 1), "queued_requests": r["queued_requests"],
        "jobs_open": len(r["backlog"]),
        "fleet": None if r.get("fleet") is None else {
            f["model"]: {"prefill_tokens_per_s": round(f["prefill_tokens_per_s"], 1),
                         "decode_tokens_per_s": round(f["decode_tokens_per_s"], 1)} for f in r["fleet"]},
    }


def describe(report: dict[str, Any]) -> str:
    """One line per instance for the terminal."""
    if not report["instances"]:
        return "control plane: no instance runs (`phaseroute control` starts one)"
    owned = sum(len(p) for p in report["partitions"].values())
    lines = []
    for inst in report["instances"]:
        desk = (f"; admission desk on jobs.submitted partitions {inst['admission_partitions'] or 'none yet'}"
                f"; job tracker on partitions {inst['tracking_partitions'] or 'none yet'}")
        if inst["role"] == "active":
            lines.append(f"control plane: {inst['instance']} active (dispatches), {owned} partitions of "
                         f"{len(report['partitions'])} topics, lag {report['lag']}{desk}")
        else:
            lines.append(f"control plane: {inst['instance']} standby{desk}")
    lines.append(f"control plane: {report['admission_lag']} submissions waiting for a verdict, "
                 f"{report['tracking_lag']} verdicts, receipts and commands waiting for their job tracker")
    load = report.get("load")
    if load is not None:
        fleet = "; ".join(f"{model} {rate['prefill_tokens_per_s']:.0f} prefill / {rate['decode_tokens_per_s']:.0f} decode tok/s"
                          for model, rate in sorted((load["fleet"] or {}).items())) or "not in this snapshot"
        lines.append(f"control plane: load snapshot {load['age_s']} s old from {load['dispatcher']}: "
                     f"{load['queued_requests']} requests queued, {load['jobs_open']} jobs open; the fleet per model "
                     f"(what admission judges with): {fleet}")
    return "\n".join(lines)
