"""Faust codecs over the very same serde, so Faust agents and confluent-kafka workers read each
other's bytes.

Importing this module registers:

- ``"phaseroute-avro"``: any kind. dumps takes a typed record (its class names the kind; a
  plain dict does not, so it is refused) or bytes already encoded; loads returns the typed
  record of whatever kind the bytes carry.
- ``"phaseroute-avro.<kind>"`` for every kind (for example ``"phaseroute-avro.job_submitted"``):
  dumps also takes a plain dict of that kind; loads refuses other kinds.

loads never raises on bad bytes: it returns an `Undecodable` (the raw bytes and the
SchemaError). Faust would otherwise turn the error into ValueDecodeError, ack the message and
throw the error into the agent's stream (faust/channels.py on_value_decode_error), crashing
the agent and losing the message. An agent checks for Undecodable and dead-letters it::

    async for event in stream.events():
        if isinstance(event.value, Undecodable):
            msg = event.message
            letter = event.value.to_dead_letter(msg.key, msg.topic, msg.partition, msg.offset, "admission", now_ms)
            await deadletter_topic.send(key=msg.topic, value=encode("dead_letter", letter))
            continue
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from faust.serializers import codecs
from faust.types.codecs import CodecT

from phaseroute.schemas.deadletter import to_dead_letter
from phaseroute.schemas.enums import DeadLetterStage
from phaseroute.schemas.errors import EncodeError, SchemaError
from phaseroute.schemas.kinds import RECORD_TYPES, to_typed
from phaseroute.schemas.serde import default_serde
from phaseroute.schemas.typed import AvroRecord

CODEC_NAME = "phaseroute-avro"


@dataclass(frozen=True)
class Undecodable:
    """What loads returns for bytes that are not a (expected) phaseroute message."""

    raw: bytes
    error: SchemaError
    expected_kind: str | None = None

    def to_dead_letter(
        self, key: bytes | None, topic: str, partition: int, offset: int, service: str, now_ms: int
    ) -> dict[str, Any]:
        return to_dead_letter(
            self.raw, key, topic, partition, offset, self.error, DeadLetterStage.DECODE, service, now_ms,
            expected_kind=self.expected_kind,
        )


class AvroCodec(codecs.Codec):
    """Faust codec: phaseroute Avro single-object encoding, for one kind or any."""

    def __init__(self, children: tuple[CodecT, ...] | None = None, *, kind: str | None = None, **kwargs: Any) -> None:
        if kind is not None:
            default_serde().registry.current(kind)  # UnknownKindError names the known kinds
        super().__init__(children=children, kind=kind, **kwargs)
        self.kind = kind

    def _dumps(self, obj: Any) -> bytes:
        if isinstance(obj, (bytes, bytearray)):
            return bytes(obj)  # already encoded (for example by serde.encode)
        if isinstance(obj, AvroRecord):
            kind = obj.KIND
            if kind is None or (self.kind is not None and kind != self.kind):
                raise EncodeError(self.kind or "?", "", obj, f"{type(obj).__name__} is not a {self.kind or 'message'} record")
            return default_serde().encode(kind, obj)
        if isinstance(obj, Mapping) and self.kind is not None:
            return default_serde().encode(self.kind, obj)
        raise EncodeError(
            self.kind or "?", "", obj,
            f"codec {CODEC_NAME} needs a typed record (phaseroute.schemas.kinds.RECORD_TYPES) to know the kind; "
            f"for plain dicts use codec {CODEC_NAME}.<kind>",
        )

    def _loads(self, s: bytes) -> AvroRecord | Undecodable:
        try:
            kind, record = default_serde().decode(s, self.kind)
        except SchemaError as exc:
            return Undecodable(bytes(s) if s is not None else b"", exc, self.kind)
        return to_typed(kind, record)


def register_codecs() -> None:
    """Register phaseroute-avro and phaseroute-avro.<kind> with Faust (idempotent)."""
    codecs.register(CODEC_NAME, AvroCodec())
    for kind in RECORD_TYPES:
        codecs.register(f"{CODEC_NAME}.{kind}", AvroCodec(kind=kind))


register_codecs()
