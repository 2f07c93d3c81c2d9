"""The Batch API's pure parts: status mapping, completion windows and metadata, keys, the
failure limiter, and tenant records -> fair-scheduler weights and quotas."""

from __future__ import annotations

import pytest

from phaseroute.api.auth import FailureLimiter
from phaseroute.api.batch_options import batch_options, check_metadata, window_seconds
from phaseroute.api.errors import ApiError
from phaseroute.api.keys import hash_key, key_id_of, make_key
from phaseroute.api.registry import (
    TenantRegistry,
    new_tenant_record,
    with_new_key,
    with_revoked,
)
from phaseroute.api.status_map import JobTrack, batch_status, timestamps
from phaseroute.schemas.examples import example
from phaseroute.streams.policy import TenantQuota
from phaseroute.streams.tenant_config import tenant_settings


def _event(state: str, at: int, total: int = 4, done: int = 0, failed: int = 0, lines: int | None = None) -> dict:
    return dict(example("job_event"), state=state, kind=state if state != "RUNNING" else "PROGRESS", at=at,
                requests_total=total, requests_done=done, requests_failed=failed,
                lines_written=done + failed if lines is None else lines)


@pytest.mark.parametrize("events,cancel,status", [
    ([], False, "validating"),
    ([], True, "cancelling"),
    ([("SUBMITTED", 0, 0)], False, "validating"),
    ([("REJECTED", 0, 0)], False, "failed"),
    ([("ADMITTED", 0, 0)], False, "in_progress"),
    ([("ADMITTED", 0, 0), ("RUNNING", 2, 0)], False, "in_progress"),
    ([("ADMITTED", 0, 0), ("RUNNING", 4, 0)], False, "finalizing"),
    ([("ADMITTED", 0, 0), ("COMPLETED", 4, 0)], False, "completed"),
    ([("ADMITTED", 0, 0), ("FAILED", 0, 4)], False, "completed"),  # every request failed: completed, as OpenAI
    ([("ADMITTED", 0, 0), ("RUNNING", 1, 0)], True, "cancelling"),
    ([("ADMITTED", 0, 0), ("CANCELLED", 1, 0)], True, "cancelling"),  # 3 requests still need their line
    ([("ADMITTED", 0, 0), ("CANCELLED", 1, 0), ("CANCELLED", 1, 3)], True, "cancelled"),
    ([("ADMITTED", 0, 0), ("EXPIRED", 3, 0)], False, "expired"),
])
def test_job_states_map_to_the_eight_batch_statuses(events, cancel, status) -> None:
    track = None
    for at, (state, done, failed) in enumerate(events):
        total = 0 if state in ("SUBMITTED", "REJECTED") else 4
        event = _event(state, 1000 * (at + 1), total, done, failed)
        if track is None:
            track = JobTrack(event)
            track.note(event)
        else:
            track.update(event)
    assert batch_status(track, cancel) == status


def test_a_final_state_is_kept_against_later_events_and_stages_have_their_times() -> None:
    track = JobTrack(_event("ADMITTED", 1_000))
    track.note(track.latest)
    track.update(_event("COMPLETED", 9_000, done=4))
    track.update(_event("RUNNING", 10_000, done=3))  # a replayed progress event read late
    assert track.latest["state"] == "COMPLETED"
    assert timestamps(track, "completed") == {"in_progress_at": 1, "finalizing_at": 9, "completed_at": 9}


@pytest.mark.parametrize("window,seconds", [("24h", 86400), ("30m", 1800), ("90s", 90), ("7d", 604800), ("1.5h", 5400)])
def test_completion_window_is_any_duration(window: str, seconds: float) -> None:
    assert window_seconds(window) == seconds


@pytest.mark.parametrize("window,needle", [("tomorrow", "must be a duration"), ("10s", "between 60 s"), ("90d", "30 days")])
def test_bad_windows_name_the_value(window: str, needle: str) -> None:
    with pytest.raises(ApiError, match=needle) as err:
        window_seconds(window)
    assert err.value.status == 400 and err.value.param == "completion_window"


def test_metadata_keys_set_priority_and_quality() -> None:
    options = batch_options("2h", {"priority": "7", "quality_tier": "Approximate", "quality_tolerance": "0.05", "x": "y"})
    assert (options.priority, options.quality_tier, options.quality_tolerance, options.window_s) == (7, "APPROXIMATE", 0.05, 7200)
    assert batch_options("24h", {}).quality_tier == "EXACT"
    for bad in ({"priority": "high"}, {"priority": "10"}, {"quality_tier": "best"}, {"quality_tolerance": "2"}):
        with pytest.raises(ApiError, match="metadata"):
            batch_options("24h", bad)
    with pytest.raises(ApiError, match="at most 16"):
        check_metadata({str(i): "v" for i in range(17)})


def test_keys_are_random_and_only_their_hash_is_kept() -> None:
    record, key = with_new_key(new_tenant_record("acme", 2.0, {}, now_ms=1), now_ms=2)
    assert key.startswith("sk-pr-") and len(key) > 40 and make_key() != key
    assert key not in repr(record) and record["keys"][0]["key_hash"] == hash_key(key)
    assert record["keys"][0]["key_id"] == key_id_of(hash_key(key))
    table = TenantRegistry()
    table.on_record(record)
    assert table.authenticate(key) == "acme"
    assert table.authenticate(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    table.on_record(with_revoked(record, record["keys"][0]["key_id"], now_ms=3))
    assert table.authenticate(key) is None
    with pytest.raises(ValueError, match="reserved"):
        new_tenant_record("_canary")


def test_failure_limiter_blocks_for_the_rest_of_the_window() -> None:
    now = [0.0]
    limiter = FailureLimiter(max_failures=3, window_s=60, clock=lambda: now[0])
    for _ in range(3):
        assert limiter.retry_after("1.2.3.4") is None
        limiter.failed("1.2.3.4")
    assert limiter.retry_after("1.2.3.4") == 60 and limiter.retry_after("5.6.7.8") is None
    now[0] = 61.0
    assert limiter.retry_after("1.2.3.4") is None


def test_tenant_records_become_weights_caps_and_quotas() -> None:
    acme = dict(example("tenant"), updated_at=5)
    older = dict(acme, weight=9.0, updated_at=1)
    off = dict(example("tenant"), name="globex", weight=1.0, max_in_flight=None, max_queued_tokens=None,
               max_running_jobs=None, disabled=True, updated_at=5)
    fair, quotas = tenant_settings([acme, older, off])
    assert fair.tenant_weights == {"acme": 2.0, "globex": 1.0}
    assert fair.tenant_max_in_flight == {"acme": 64}
    assert quotas == {"acme": TenantQuota(2_000_000, 10), "globex": TenantQuota(None, 0)}
    with pytest.raises(ValueError, match="tenant 'acme': weight must be a positive number, got 0"):
        tenant_settings([dict(acme, weight=0)])


def test_a_cancelled_batch_is_cancelled_once_every_line_is_written() -> None:
    track = JobTrack(_event("ADMITTED", 1_000))
    track.note(track.latest)
    track.update(_event("CANCELLED", 2_000, done=1, failed=3, lines=1))  # failed at once, lines still to come
    assert batch_status(track, True) == "cancelling"
    track.update(_event("CANCELLED", 5_000, done=1, failed=2, lines=4))  # the sink ran ahead of the core's count
    assert batch_status(track, True) == "cancelling"
    track.update(_event("CANCELLED", 7_000, done=1, failed=3, lines=4))  # the core's "output whole" event
    assert batch_status(track, True) == "cancelled"
    assert timestamps(track, "cancelled")["cancelled_at"] == 7
