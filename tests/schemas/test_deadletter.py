"""Garbage in, a dead letter with a precise reason out; never an exception."""

from __future__ import annotations

import json
import random

import pytest

from phaseroute.schemas import serde
from phaseroute.schemas.deadletter import Decoded, Rejected, safe_decode, to_dead_letter
from phaseroute.schemas.errors import CorruptBodyError, NotSingleObjectError, WrongKindError
from phaseroute.schemas.examples import KINDS, T0, example
from phaseroute.schemas.registry import default_registry


def _reject(value: object, expected_kind: str | None = "job_submitted") -> dict:
    out = safe_decode(value, b"acme-1", topic="jobs.submitted", partition=2, offset=41,
                      service="admission", now_ms=T0, expected_kind=expected_kind)
    assert isinstance(out, Rejected), out
    letter = out.dead_letter
    assert serde.decode(serde.encode("dead_letter", letter)) == ("dead_letter", letter)  # always producible
    assert (letter["source_topic"], letter["partition"], letter["offset"]) == ("jobs.submitted", 2, 41)
    assert letter["stage"] == "DECODE" and letter["service"] == "admission" and letter["at"] == T0
    assert letter["reason"].endswith("(read from topic jobs.submitted partition 2 offset 41)")
    return letter


def test_json_instead_of_avro_is_named_with_its_first_bytes() -> None:
    raw = json.dumps(example("job_command")).encode()
    letter = _reject(raw)
    assert letter["reason"].startswith("not Avro single-object encoding: first bytes 0x7b226a6f625f6964223a")
    assert "looks like text or JSON" in letter["reason"]
    assert letter["error_class"] == "NotSingleObjectError"
    assert (letter["value"], letter["key"], letter["expected_kind"]) == (raw, b"acme-1", "job_submitted")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", "not Avro single-object encoding: empty value (0 bytes)"),
        (b"\xc3\x01\x00", "not Avro single-object encoding: first bytes 0xc30100, only 3 bytes"),
        ("a str", "not Avro single-object encoding: the value is a str, not bytes"),
    ],
)
def test_short_or_odd_values(raw: object, expected: str) -> None:
    assert _reject(raw)["reason"].startswith(expected)


def test_tombstone() -> None:
    letter = _reject(None)
    assert letter["reason"].startswith("tombstone (no value) where a job_submitted was expected")
    assert letter["value"] is None and letter["error_class"] == "TombstoneError"


def test_unknown_fingerprint_names_it() -> None:
    raw = b"\xc3\x01" + (0x0123456789ABCDEF).to_bytes(8, "little") + b"\x02\x04"
    letter = _reject(raw)
    assert letter["reason"].startswith("unknown writer fingerprint 0x0123456789abcdef: not any version")
    assert letter["error_class"] == "UnknownFingerprintError"


def test_wrong_kind_names_both_kinds() -> None:
    letter = _reject(serde.encode("job_command", example("job_command")))
    fingerprint = default_registry().current("job_command").fingerprint_hex
    assert letter["reason"].startswith(f"expected a job_submitted message, got a job_command (v1, writer fingerprint {fingerprint})")
    assert letter["error_class"] == WrongKindError.__name__


@pytest.mark.parametrize("kind", KINDS)
def test_every_truncation_of_every_kind_is_a_corrupt_body(kind: str) -> None:
    data = serde.encode(kind, example(kind))
    for cut in range(10, len(data)):
        out = safe_decode(data[:cut], None, topic="t", partition=0, offset=cut, service="s", now_ms=0)
        assert isinstance(out, Rejected), f"{kind} cut at {cut} decoded"
        assert isinstance(out.error, CorruptBodyError)
        version = default_registry().current(kind).version
        assert out.dead_letter["reason"].startswith(f"body of {kind} v{version} (writer fingerprint 0x")
        assert "truncated or corrupt" in out.dead_letter["reason"]


def test_trailing_bytes_are_refused() -> None:
    letter = _reject(serde.encode("job_submitted", example("job_submitted")) + b"\x00\x00")
    assert letter["reason"].startswith("2 trailing bytes after the body of job_submitted v1")


def test_random_bodies_behind_a_valid_header_never_raise() -> None:
    rng = random.Random(7)
    kinds = default_registry().kinds()
    for _ in range(400):
        kind = rng.choice(kinds)
        good = serde.encode(kind, example(kind))
        body = bytearray(good[10:])
        for _ in range(rng.randint(1, 4)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        out = safe_decode(good[:10] + bytes(body), None, topic="t", partition=0, offset=0, service="s", now_ms=0)
        assert isinstance(out, (Decoded, Rejected))


def test_a_good_message_decodes() -> None:
    out = safe_decode(serde.encode("job_submitted", example("job_submitted")), b"k", topic="jobs.submitted",
                      partition=0, offset=0, service="admission", now_ms=T0, expected_kind="job_submitted")
    assert out == Decoded("job_submitted", example("job_submitted"))


def test_validate_and_process_failures() -> None:
    raw = serde.encode("job_submitted", example("job_submitted"))
    letter = to_dead_letter(raw, None, "jobs.submitted", 1, 7, ValueError("deadline is before submitted_at"),
                            "VALIDATE", "admission", T0)
    assert letter["stage"] == "VALIDATE" and letter["traceback"] is None
    assert letter["reason"] == "ValueError: deadline is before submitted_at (read from topic jobs.submitted partition 1 offset 7)"
    named = to_dead_letter(raw, None, "jobs.submitted", 1, 7, ValueError("deadline is before submitted_at"),
                           "VALIDATE", "admission", T0, error_class="DeadlineBeforeSubmission")
    assert named["error_class"] == "DeadlineBeforeSubmission"
    assert named["reason"].startswith("DeadlineBeforeSubmission: deadline is before submitted_at")
    try:
        {}["missing"]
    except KeyError as exc:
        letter = to_dead_letter(raw, None, "jobs.submitted", None, None, exc, None, "admission", T0)
    assert letter["stage"] == "PROCESS" and "Traceback" in letter["traceback"]
    assert (letter["partition"], letter["offset"]) == (-1, -1)
    assert to_dead_letter(b"x", None, "t", 0, 0, NotSingleObjectError("n"), None, "s", 0)["stage"] == "DECODE"
    serde.encode("dead_letter", letter)
