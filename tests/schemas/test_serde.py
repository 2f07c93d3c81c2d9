"""Single-object encoding: round trips of every kind, and encode errors that name the field."""

from __future__ import annotations

import pytest

from phaseroute.schemas import serde
from phaseroute.schemas.errors import EncodeError, UnknownKindError
from phaseroute.schemas.examples import KINDS, example
from phaseroute.schemas.kinds import to_typed
from phaseroute.schemas.registry import default_registry


def test_examples_cover_every_kind() -> None:
    assert set(KINDS) == set(default_registry().kinds())


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_round_trips(kind: str) -> None:
    record = example(kind)
    data = serde.encode(kind, record)
    assert data[:10] == default_registry().current(kind).header
    assert serde.decode(data) == (kind, record)
    assert serde.decode(data, expected_kind=kind) == (kind, record)


@pytest.mark.parametrize("kind", KINDS)
def test_typed_records_round_trip_through_the_same_bytes(kind: str) -> None:
    record = example(kind)
    typed = to_typed(kind, record)
    assert typed.to_dict() == record
    assert serde.encode(kind, typed) == serde.encode(kind, record)


def test_fields_with_defaults_may_be_left_out() -> None:
    record = example("job_command")
    del record["reason"]
    assert serde.decode(serde.encode("job_command", record))[1]["reason"] is None


def _encode_error(kind: str, **changes: object) -> str:
    record = example(kind)
    record.update(changes)
    with pytest.raises(EncodeError) as info:
        serde.encode(kind, record)
    return str(info.value)


@pytest.mark.parametrize(
    ("kind", "changes", "expected"),
    [
        ("job_submitted", {"deadline": "tomorrow"}, "record fails schema job_submitted: field deadline = 'tomorrow' (str) is not a long"),
        ("job_submitted", {"priority": 2.5}, "field priority = 2.5 (float) is not an int"),
        ("job_submitted", {"priority": True}, "field priority = True (bool) is not an int"),
        ("job_submitted", {"priority": 2**31}, "field priority = 2147483648 (int) is out of the int range"),
        ("job_submitted", {"quality_tier": "BEST"}, "field quality_tier = 'BEST' (str) is not one of the symbols EXACT, APPROXIMATE"),
        ("job_submitted", {"quality_tolerance": "0.1"}, "field quality_tolerance = '0.1' (str) is not a double"),
        ("job_submitted", {"quality_tolrance": 0.1}, "field quality_tolrance = 0.1 (float) is not a field of phaseroute.JobSubmitted"),
        ("kv_ready", {"prefill_time_s": None}, "field prefill_time_s = None (NoneType) is not a double"),
        ("result", {"output_token_ids": [1, "2"]}, "field output_token_ids[1] = '2' (str) is not an int"),
        ("job_submitted", {"metadata": {"project": 7}}, "field metadata['project'] = 7 (int) is not a string"),
    ],
)
def test_encode_names_the_field_and_value(kind: str, changes: dict, expected: str) -> None:
    assert expected in _encode_error(kind, **changes)


def test_encode_names_nested_paths_and_missing_fields() -> None:
    record = example("job_submitted")
    record["requests"][0]["messages"][0]["role"] = None
    with pytest.raises(EncodeError, match=r"field requests\[0\]\.messages\[0\]\.role = None \(NoneType\) is not a string"):
        serde.encode("job_submitted", record)
    record = example("job_submitted")
    del record["sampling"]["temperature"]  # has a default: fine
    serde.encode("job_submitted", record)
    del record["deadline"]
    with pytest.raises(EncodeError, match="field deadline = None .* is missing, and the field has no default"):
        serde.encode("job_submitted", record)


def test_encode_error_carries_field_and_value() -> None:
    record = example("request")
    record["prompt_tokens"] = -1.0
    with pytest.raises(EncodeError) as info:
        serde.encode("request", record)
    assert (info.value.kind, info.value.field, info.value.value) == ("request", "prompt_tokens", -1.0)


def test_without_validation_fastavro_still_refuses_missing_fields() -> None:
    record = example("job_command")
    del record["job_id"]
    with pytest.raises(EncodeError, match="is refused by fastavro: ValueError: no value and no default for job_id"):
        serde.encode("job_command", record, validate=False)


def test_a_typed_record_of_another_kind_is_refused() -> None:
    typed = to_typed("job_command", example("job_command"))
    with pytest.raises(EncodeError, match="is a typed job_command record, not a job_event"):
        serde.encode("job_event", typed)


def test_unknown_kind_on_encode_and_expected_kind() -> None:
    with pytest.raises(UnknownKindError, match="unknown message kind 'jobs'"):
        serde.encode("jobs", {})
    data = serde.encode("job_command", example("job_command"))
    with pytest.raises(UnknownKindError, match="unknown message kind 'job_comand'"):
        serde.decode(data, expected_kind="job_comand")
