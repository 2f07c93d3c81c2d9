"""Deterministic ids: same inputs, same id; no ambiguity between different inputs."""

from __future__ import annotations

import pytest

from phaseroute.schemas.enums import JobEventKind, TelemetryPhase
from phaseroute.schemas.ids import attempt_id, job_event_id, profile_key, request_id


def test_request_id_is_deterministic_and_unambiguous() -> None:
    assert request_id("job-1", "q-1") == request_id("job-1", "q-1")
    assert len(request_id("job-1", "q-1")) == 32
    assert request_id("ab", "c") != request_id("a", "bc")  # length-prefixed parts
    assert request_id("job-1", "q-1") != request_id("job-2", "q-1")


def test_request_id_is_stable_across_releases() -> None:
    """Ids already in topics and result files must come out the same after any rewrite."""
    assert request_id("j1", "0") == "11cabe2d1489eae3ab5b100bbb30b579"


def test_attempt_id() -> None:
    assert attempt_id("r1", "prefill", 0) == "r1/prefill/0"
    with pytest.raises(ValueError, match="attempt phase 'PREFILL' is not one of"):
        attempt_id("r1", "PREFILL", 0)
    with pytest.raises(ValueError, match="attempt number -1 is negative"):
        attempt_id("r1", "decode", -1)


def test_job_event_id_and_profile_key() -> None:
    assert job_event_id("job-1", JobEventKind.PROGRESS, 7) == "job-1/progress/7"
    assert profile_key("m", TelemetryPhase.TRANSFER, "gpu-b", "bf16", "cpu-a") == "m|TRANSFER|gpu-b|bf16|cpu-a"
    assert profile_key("m", "DECODE", "gpu-b", "bf16") == "m|DECODE|gpu-b|bf16"
    with pytest.raises(ValueError, match="must not contain"):
        profile_key("m|x", "DECODE", "p", "v")
