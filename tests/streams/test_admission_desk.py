"""Admission desks of two control-plane instances, without Kafka: each judges the jobs of its own
partitions against the dispatcher's load snapshot, counts its own admissions until a snapshot
holds them, and knows every id judged before on a partition it is given (from the verdicts on
``jobs.admissions``), wherever it was judged. The tokenizer is SmolLM2's real one; the pools are
a fleet we do not have, described by heartbeats and profile rows (fakes for hardware)."""

from __future__ import annotations

import time

import pytest

from phaseroute.config import settings
from phaseroute.infra.blobstore import output_prefix
from phaseroute.schemas.serde import decode, encode
from phaseroute.streams.admission_desk import AdmissionDesk
from phaseroute.streams.admission_edge import load_of
from phaseroute.streams.model_catalog import load_model_info

from .test_control_plane import MODEL, Plane, job, plane


@pytest.fixture(scope="module")
def model_info():
    return load_model_info(MODEL, settings().model_cache)


def _desk(cp: Plane, name: str) -> AdmissionDesk:
    return AdmissionDesk(name, cp.config, {MODEL: cp.desk.models[MODEL]}, cp.pools, cp.profiles, output_prefix)


def _judge(desk: AdmissionDesk, record: dict, now: float) -> tuple[list, list]:
    verdict, requests = desk.submitted(record, desk.intake(record), now)
    return verdict, list(requests)


def _state(sends: list) -> str:
    return next(s.record["state"] for s in sends if s.topic == "jobs.events")


def test_a_desk_counts_its_own_admissions_until_the_snapshot_holds_them(model_info) -> None:
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    a, b = _desk(cp, "desk-a"), _desk(cp, "desk-b")
    snapshot = cp.shell.load("dispatcher", now).record
    a.on_load(snapshot)
    b.on_load(snapshot)

    verdict, requests = _judge(a, job("j-a", "acme", 5, 600, now), now)
    assert _state(verdict) == "ADMITTED" and len(requests) == 5
    assert [s.topic for s in verdict][0] == "jobs.admissions"  # the verdict goes first, for the tracker
    assert [j.job_id for j in a.backlog()] == ["j-a"]  # desk a counts it at once
    assert b.backlog() == []  # desk b learns it only through the dispatcher's next snapshot

    later = now + 1
    for s in verdict:  # the tracker takes the verdict; its next snapshot holds the job
        if s.topic == "jobs.admissions":
            cp.shell.on_record("job_admission", s.record, later)
    snapshot = cp.shell.load("dispatcher", later).record
    a.on_load(snapshot)
    b.on_load(snapshot)
    assert [j.job_id for j in a.backlog()] == ["j-a"] == [j.job_id for j in b.backlog()]  # once each, not twice
    assert abs((a.load_age(later + 3) or 0) - 3.0) < 0.01  # ms on the wire


def test_an_id_judged_at_another_desk_is_not_run_again(model_info) -> None:
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    a, b = _desk(cp, "desk-a"), _desk(cp, "desk-b")
    for d in (a, b):
        d.on_load(cp.shell.load("dispatcher", now).record)
    record = job("j-1", "acme", 3, 600, now)
    verdict, first = _judge(a, record, now)
    for s in verdict:  # desk b is given the partition (desk a left) and reads its verdicts back
        if s.topic == "jobs.admissions":
            b.learn(s.record)

    replay, requests = _judge(b, record, now + 5)  # the same submission read again (a was killed before its commit)
    assert not any(s.topic == "jobs.admissions" for s in replay)  # no new verdict
    assert "job id already submitted; not run again (it was ADMITTED" in replay[0].record["reason"]
    ids = [r.record["request_id"] for r in requests]
    assert len(ids) == 3 and ids == [r.record["request_id"] for r in first]  # queued again under the same ids

    other, requests = _judge(b, job("j-1", "acme", 3, 600, now + 9), now + 9)  # a new submission under the id
    assert not any(s.topic == "jobs.admissions" for s in other) and requests == []


def test_a_desk_judges_with_the_fleet_rate_in_the_dispatchers_snapshot(model_info) -> None:
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    assert cp.shell.core.fleet_rates(now)[MODEL].decode_tokens_per_s == 0  # the dispatcher has not seen the pool yet
    cp.tick(now)  # now it has
    snapshot = cp.shell.load("dispatcher", now).record
    _, decoded = decode(encode("load_snapshot", snapshot), "load_snapshot")  # as a desk reads it off control.load
    rate = cp.shell.core.fleet_rates(now)[MODEL]
    assert rate.prefill_tokens_per_s > 0 and rate.decode_tokens_per_s > 0
    assert decoded["fleet"] == [{"model": MODEL, "prefill_tokens_per_s": rate.prefill_tokens_per_s,
                                 "decode_tokens_per_s": rate.decode_tokens_per_s}]

    as_published, slower, none = _desk(cp, "desk-a"), _desk(cp, "desk-b"), _desk(cp, "desk-c")
    as_published.on_load(decoded)
    slower.on_load({**decoded, "fleet": [{"model": MODEL, "prefill_tokens_per_s": rate.prefill_tokens_per_s / 1000,
                                          "decode_tokens_per_s": rate.decode_tokens_per_s / 1000}]})
    none.on_load({**decoded, "fleet": [{"model": MODEL, "prefill_tokens_per_s": 0.0, "decode_tokens_per_s": 0.0}]})

    verdict, _ = _judge(as_published, job("j-1", "acme", 5, 600, now), now)
    assert _state(verdict) == "ADMITTED"
    # the same job against a dispatcher that measured a fleet 1000x slower: its 600 s deadline cannot be met,
    # and the reason names the snapshot's rates, not the desk's own view of the pools
    verdict, requests = _judge(slower, job("j-1", "acme", 5, 600, now), now)
    reason = next(s.record["reason"] for s in verdict if s.topic == "jobs.events")
    assert _state(verdict) == "REJECTED" and requests == []
    assert f"at {rate.prefill_tokens_per_s / 1000:.0f} prefill / {rate.decode_tokens_per_s / 1000:.0f} decode tokens/s" in reason
    # a snapshot that gives the model no rate (a pool that came up after it was taken): the desk's own view decides
    verdict, _ = _judge(none, job("j-1", "acme", 5, 600, now), now)
    assert _state(verdict) == "ADMITTED"


def test_a_snapshot_from_a_dispatcher_before_fleet_rates_still_reads() -> None:
    old = {"at": 1_000, "dispatcher": "d", "admissions_through": 0, "queued_requests": 0, "backlog": []}
    assert load_of(old).fleet is None
    assert load_of({**old, "fleet": []}).fleet == {}
