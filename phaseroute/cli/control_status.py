"""What ``phaseroute pools`` says about the control plane, from the broker alone.

* instances: the members of the control lease group (``infra/control_lease.py``); the one
  holding the lease is ``active`` (it dispatches), the rest are ``standby``;
* each instance's admission desk: the ``jobs.submitted`` partitions the admission group
  (``phaseroute-admission``) gives it, and the submissions not judged yet (``admission_lag``);
* partitions: what the active instance's Faust consumer (group ``phaseroute-control``) is
  assigned, per topic (the dispatcher owns every partition of the topics it reads);
* lag: the control inputs the Faust group has not committed yet (broker watermarks).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from phaseroute.infra import topics
from phaseroute.infra.control_lease import lease_members
from phaseroute.infra.group_admin import describe_group

# what the control plane consumes (its Faust agents' topics)
CONTROL_INPUTS = (topics.JOBS_ADMISSIONS, topics.REQUESTS_PENDING, topics.KV_READY, topics.RESULTS,
                  topics.ATTEMPTS_FAILED, topics.RESULTS_WRITTEN, topics.JOBS_COMMANDS, topics.CANARY_RESULTS)


def control_report(admin: AdminClient, consumer: Consumer, bootstrap: str, timeout_s: float) -> dict[str, Any]:
    """{"active", "instances": [{"instance", "host", "role"}], "partitions": {topic: [..]}, "lag", "lag_by_topic"}."""
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
    desks = {m.client_id: sorted(tp.partition for tp in (m.assignment.topic_partitions if m.assignment else []))
             for m in describe_group(admin, topics.ADMISSION_GROUP, timeout_s).members}
    admission_lag = group_lag(admin, consumer, topics.ADMISSION_GROUP, [topics.JOBS_SUBMITTED], timeout_s)
    return {
        "active": active,
        "instances": [{"instance": m.client_id, "host": m.host, "role": "active" if m.active else "standby",
                       "admission_partitions": desks.get(m.client_id, [])} for m in members],
        "admission_lag": sum(admission_lag.values()),
        "partitions": {t: sorted(p) for t, p in sorted(partitions.items())},
        "lag": sum(lag.values()), "lag_by_topic": lag,
    }


def describe(report: dict[str, Any]) -> str:
    """One line per instance for the terminal."""
    if not report["instances"]:
        return "control plane: no instance runs (`phaseroute control` starts one)"
    owned = sum(len(p) for p in report["partitions"].values())
    lines = []
    for inst in report["instances"]:
        desk = f"; admission desk on jobs.submitted partitions {inst['admission_partitions'] or 'none yet'}"
        if inst["role"] == "active":
            lines.append(f"control plane: {inst['instance']} active (dispatches), {owned} partitions of "
                         f"{len(report['partitions'])} topics, lag {report['lag']}{desk}")
        else:
            lines.append(f"control plane: {inst['instance']} standby{desk}")
    lines.append(f"control plane: {report['admission_lag']} submissions waiting for a verdict")
    return "\n".join(lines)
