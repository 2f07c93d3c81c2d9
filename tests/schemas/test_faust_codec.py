"""The Faust codec writes and reads exactly the serde's bytes."""

from __future__ import annotations

import faust
import pytest
from faust.serializers import codecs

from phaseroute.schemas import serde
from phaseroute.schemas.errors import EncodeError, NotSingleObjectError, WrongKindError
from phaseroute.schemas.examples import KINDS, example
from phaseroute.schemas.faust_codec import CODEC_NAME, AvroCodec, Undecodable
from phaseroute.schemas.kinds import to_typed


@pytest.mark.parametrize("kind", KINDS)
def test_dumps_and_loads_equal_the_serde(kind: str) -> None:
    record = example(kind)
    data = serde.encode(kind, record)
    typed = to_typed(kind, record)
    assert codecs.dumps(CODEC_NAME, typed) == data
    assert codecs.dumps(f"{CODEC_NAME}.{kind}", record) == data
    for name in (CODEC_NAME, f"{CODEC_NAME}.{kind}"):
        loaded = codecs.loads(name, data)
        assert loaded == typed and loaded.to_dict() == serde.decode(data)[1]


def test_the_any_kind_codec_refuses_plain_dicts() -> None:
    with pytest.raises(EncodeError, match="needs a typed record"):
        codecs.dumps(CODEC_NAME, example("job_command"))


def test_a_kind_codec_refuses_other_kinds() -> None:
    with pytest.raises(EncodeError, match="JobCommand is not a job_event record"):
        codecs.dumps(f"{CODEC_NAME}.job_event", to_typed("job_command", example("job_command")))
    loaded = codecs.loads(f"{CODEC_NAME}.job_event", serde.encode("job_command", example("job_command")))
    assert isinstance(loaded, Undecodable) and isinstance(loaded.error, WrongKindError)


def test_garbage_loads_as_undecodable_that_becomes_a_dead_letter() -> None:
    loaded = codecs.loads(f"{CODEC_NAME}.job_submitted", b'{"job_id": 1}')
    assert isinstance(loaded, Undecodable) and isinstance(loaded.error, NotSingleObjectError)
    letter = loaded.to_dead_letter(b"k", "jobs.submitted", 3, 14, "admission", 0)
    assert letter["reason"].startswith("not Avro single-object encoding: first bytes 0x7b226a6f625f6964223a")
    assert letter["expected_kind"] == "job_submitted"
    serde.encode("dead_letter", letter)


def test_faust_app_serializers_pass_the_typed_record_through() -> None:
    app = faust.App("phaseroute-codec-test", broker="memory://", store="memory://")
    data = serde.encode("kv_ready", example("kv_ready"))
    value = app.serializers.loads_value(None, data, serializer=CODEC_NAME)
    assert value == to_typed("kv_ready", example("kv_ready"))
    assert app.serializers.dumps_value(None, value, serializer=CODEC_NAME) == data


def test_clone_keeps_the_kind() -> None:
    codec = AvroCodec(kind="job_event")
    assert codec.clone().kind == "job_event"
