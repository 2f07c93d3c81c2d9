"""Life-cycle enums, attempt ids, and validation messages that name the bad value."""

from __future__ import annotations

import pytest

from phaseroute.schemas.enums import JobState
from phaseroute.streams.policy import (
    AdmissionConfig,
    AttemptStatus,
    ConfidenceConfig,
    CurvePoint,
    FairConfig,
    Phase,
    ProfileRow,
    ProfileSource,
    RetryConfig,
    RouterConfig,
    ScorerWeights,
    attempt_id,
    job_transition_error,
    parse_attempt_id,
)


def test_attempt_id_is_deterministic_and_parses_back():
    a = attempt_id("job-1/7", Phase.DECODE, 2)
    assert a == attempt_id("job-1/7", Phase.DECODE, 2) == "job-1/7/decode/2"
    assert parse_attempt_id(a) == ("job-1/7", Phase.DECODE, 2)
    assert parse_attempt_id(attempt_id("a/b", Phase.PREFILL, 0)) == ("a/b", Phase.PREFILL, 0)
    assert len({attempt_id("r", p, n) for p in Phase for n in range(3)}) == 6


@pytest.mark.parametrize("bad", ["nope", "r/decode/x", "r/middle/1"])
def test_parse_attempt_id_rejects_garbage(bad):
    with pytest.raises(ValueError, match=repr(bad)):
        parse_attempt_id(bad)


def test_attempt_id_rejects_negative_attempt():
    with pytest.raises(ValueError, match="-1"):
        attempt_id("r", Phase.PREFILL, -1)


def test_job_status_order_and_finished():
    assert JobState.SUBMITTED < JobState.ADMITTED < JobState.RUNNING < JobState.COMPLETED
    assert JobState.REJECTED < JobState.RUNNING
    assert JobState.ADMITTED.stage == JobState.REJECTED.stage == 1
    finished = {s for s in JobState if s.is_finished}
    assert finished == {
        JobState.REJECTED,
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.EXPIRED,
    }


def test_attempt_status_finished():
    assert not AttemptStatus.WAITING_FOR_KV.is_finished
    assert AttemptStatus.QUEUED < AttemptStatus.WAITING_FOR_KV < AttemptStatus.RUNNING
    assert {s for s in AttemptStatus if s.is_finished} == {
        AttemptStatus.SUCCEEDED,
        AttemptStatus.FAILED,
        AttemptStatus.CANCELLED,
        AttemptStatus.SUPERSEDED,
    }


@pytest.mark.parametrize(
    ("old", "new", "ok"),
    [
        (JobState.SUBMITTED, JobState.ADMITTED, True),
        (JobState.SUBMITTED, JobState.REJECTED, True),
        (JobState.ADMITTED, JobState.RUNNING, True),
        (JobState.RUNNING, JobState.COMPLETED, True),
        (JobState.RUNNING, JobState.EXPIRED, True),
        (JobState.RUNNING, JobState.RUNNING, True),  # replay
        (JobState.SUBMITTED, JobState.RUNNING, False),
        (JobState.REJECTED, JobState.RUNNING, False),
        (JobState.COMPLETED, JobState.FAILED, False),
        (JobState.RUNNING, JobState.ADMITTED, False),
    ],
)
def test_job_transitions(old, new, ok):
    assert (job_transition_error(old, new) is None) is ok


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: RouterConfig(exploration_share=1.5), "RouterConfig.exploration_share must be in [0, 1], got 1.5"),
        (lambda: RouterConfig(max_share_step=0.0), "max_share_step must be > 0, got 0.0"),
        (lambda: RouterConfig(max_error_rate=0.0), "max_error_rate must be > 0, got 0.0"),
        (lambda: ScorerWeights(completion=-1.0), "ScorerWeights.completion must be >= 0, got -1.0"),
        (lambda: FairConfig(tenant_weights={"a": 0.0}), "FairConfig.tenant_weights['a'] must be > 0, got 0.0"),
        (lambda: FairConfig(max_unit_requests=0), "max_unit_requests must be >= 1, got 0"),
        (lambda: RetryConfig(jitter_fraction=2.0), "RetryConfig.jitter_fraction must be in [0, 1], got 2.0"),
        (lambda: ConfidenceConfig(samples_scale=float("nan")), "samples_scale must be a finite number, got nan"),
        (lambda: AdmissionConfig(safety_factor=0.5), "AdmissionConfig.safety_factor must be >= 1.0, got 0.5"),
        (lambda: CurvePoint(0, 10.0), "CurvePoint.batch_size must be >= 1, got 0"),
    ],
)
def test_config_validation_names_the_bad_value(make, needle):
    with pytest.raises(ValueError) as err:
        make()
    assert needle in str(err.value)


def test_profile_row_rejects_unordered_quantiles_and_curve():
    curve = (CurvePoint(1, 10.0), CurvePoint(8, 50.0))
    with pytest.raises(ValueError, match=r"p50 <= p90 <= p99, got 0\.3, 0\.2, 0\.1"):
        ProfileRow("m", Phase.DECODE, "p", "v", curve, 0.3, 0.2, 0.1, 0, 0, 0, 1, 1, 0, ProfileSource.TELEMETRY)
    with pytest.raises(ValueError, match=r"strictly increasing, got \[8, 1\]"):
        ProfileRow("m", Phase.DECODE, "p", "v", curve[::-1], 0.1, 0.2, 0.3, 0, 0, 0, 1, 1, 0, ProfileSource.TELEMETRY)


def test_curve_interpolation(mk):
    r = mk.row("p", Phase.DECODE, 800.0)  # (1, 100), (8, 400), (32, 800)
    assert r.tokens_per_s(1) == 100.0
    assert r.tokens_per_s(20) == pytest.approx(600.0)
    assert r.tokens_per_s(64) == 800.0
    assert r.max_batch_size == 32


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("workers", -1, "workers"),
        ("free_kv_bytes", float("nan"), "free_kv_bytes"),
        ("queue_tokens", float("inf"), "queue_tokens"),
        ("in_flight", True, "in_flight"),
        ("max_batch", 0, "max_batch"),
        ("price_per_hour", -2.0, "price_per_hour"),
        ("name", " ", "name"),
    ],
)
def test_pool_state_names_the_bad_field(mk, field, value, needle):
    """The one-pass check of the common case must not let a bad value through."""
    from dataclasses import replace

    good = mk.pool("p", price=3.0)
    with pytest.raises(ValueError, match=needle):
        replace(good, **{field: value})


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("request_id", "", "request_id"),
        ("prompt_tokens", 0, "prompt_tokens"),
        ("max_output_tokens", float("nan"), "max_output_tokens"),
        ("quality_tolerance", 1.5, "quality_tolerance"),
        ("attempt", -1, "attempt"),
        ("deadline", float("inf"), "deadline"),
    ],
)
def test_request_work_names_the_bad_field(mk, field, value, needle):
    from dataclasses import replace

    with pytest.raises(ValueError, match=needle):
        replace(mk.req(), **{field: value})
