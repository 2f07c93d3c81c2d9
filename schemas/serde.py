"""Avro single-object encoding of every phaseroute message, for confluent-kafka and Faust alike.

Wire format (Avro specification, "Single object encoding")::

    0xC3 0x01 | 8-byte little-endian CRC-64-AVRO fingerprint of the writer schema | binary body

`encode` writes with the current schema of a kind. `decode` finds the writer schema by its
fingerprint (any version the registry ships, see `registry`), then lets fastavro resolve it
against the current reader schema of the same kind: fields added later with a default are
filled in, fields removed later are skipped. So the kind travels in the bytes; a consumer that
expects one kind passes `expected_kind` and gets WrongKindError for any other.

Every failure is a subclass of SchemaError whose message is a dead-letter reason (see
`deadletter.safe_decode` for the never-raising variant).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from io import BytesIO
from typing import Any, cast

from fastavro import schemaless_reader, schemaless_writer

from phaseroute.schemas.check import Check, compile_checker
from phaseroute.schemas.errors import (
    CorruptBodyError,
    EncodeError,
    NotSingleObjectError,
    UnknownFingerprintError,
    WrongKindError,
)
from phaseroute.schemas.registry import HEADER_LEN, MAGIC, Registry, SchemaVersion, default_registry


class Serde:
    """Encoder/decoder bound to one registry; parsed schemas and checkers are cached."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._checkers: dict[str, Check] = {}

    def encode(self, kind: str, record: Mapping[str, Any] | Any, *, validate: bool = True) -> bytes:
        """Single-object bytes of `record` (a dict, or a typed record with to_dict()).

        validate=False skips the strict check (about 40% of the cost) for records built by
        tested code: fastavro alone still fills defaults and refuses missing required fields and
        most wrong types, but drops unknown fields and coerces 2.5 to 2 for an int.
        """
        schema = self.registry.current(kind)
        if not isinstance(record, Mapping) and hasattr(record, "to_dict"):
            record_kind = getattr(record, "KIND", kind)
            if record_kind != kind:
                raise EncodeError(kind, "", record, f"is a typed {record_kind} record, not a {kind}")
            record = record.to_dict()
        if validate:
            self._checker(schema)(record)
        buffer = BytesIO()
        buffer.write(schema.header)
        try:
            schemaless_writer(buffer, schema.parsed, record)
        except Exception as exc:  # fastavro raises TypeError, ValueError, KeyError... name them all
            raise EncodeError(kind, "", _preview(record), f"is refused by fastavro: {type(exc).__name__}: {exc}") from exc
        return buffer.getvalue()

    def validate(self, kind: str, record: Mapping[str, Any]) -> None:
        """Raise EncodeError naming the first field of `record` that does not fit `kind`."""
        self._checker(self.registry.current(kind))(record)

    def decode(self, data: bytes, expected_kind: str | None = None) -> tuple[str, dict[str, Any]]:
        """(kind, record) of single-object bytes, resolved to the current schema of that kind."""
        if expected_kind is not None:
            self.registry.current(expected_kind)  # UnknownKindError for a typo in the caller
        writer = self.writer_of(data)
        if expected_kind is not None and writer.kind != expected_kind:
            raise WrongKindError(
                expected_kind,
                writer.kind,
                f"expected a {expected_kind} message, got a {writer.kind} (v{writer.version}, "
                f"writer fingerprint {writer.fingerprint_hex})",
            )
        reader = self.registry.current(writer.kind)
        stream = BytesIO(data)
        stream.seek(HEADER_LEN)
        try:
            record = cast(dict[str, Any], schemaless_reader(stream, writer.parsed, None if reader is writer else reader.parsed))
        except Exception as exc:  # truncated input raises EOFError, StopIteration, IndexError, ...
            raise CorruptBodyError(
                f"body of {_describe(writer)} is truncated or corrupt: {type(exc).__name__}: {exc} "
                f"(stopped at byte {stream.tell()} of {len(data)})"
            ) from exc
        if stream.tell() != len(data):
            raise CorruptBodyError(
                f"{len(data) - stream.tell()} trailing bytes after the body of {_describe(writer)} "
                f"({len(data)} bytes in all; the body ended at byte {stream.tell()})"
            )
        return writer.kind, record

    def writer_of(self, data: bytes) -> SchemaVersion:
        """The writer schema named by the header of `data`; raises on a bad or unknown header."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise NotSingleObjectError(f"not Avro single-object encoding: the value is a {type(data).__name__}, not bytes")
        data = bytes(data[:HEADER_LEN])
        if len(data) < HEADER_LEN or data[:2] != MAGIC:
            raise NotSingleObjectError(
                f"not Avro single-object encoding: {_head(data)}; expected 0xC3 0x01 + 8-byte fingerprint"
            )
        fingerprint = int.from_bytes(data[2:HEADER_LEN], "little")
        writer = self.registry.by_fingerprint(fingerprint)
        if writer is None:
            raise UnknownFingerprintError(
                fingerprint,
                f"unknown writer fingerprint 0x{fingerprint:016x}: not any version of the kinds this reader "
                f"ships ({', '.join(self.registry.kinds())}); a newer writer (upgrade this service) or a foreign producer",
            )
        return writer

    def _checker(self, schema: SchemaVersion) -> Check:
        check = self._checkers.get(schema.kind)
        if check is None:
            check = self._checkers[schema.kind] = compile_checker(schema.kind, schema.source)
        return check


def _describe(writer: SchemaVersion) -> str:
    return f"{writer.kind} v{writer.version} (writer fingerprint {writer.fingerprint_hex})"


def _head(data: bytes) -> str:
    """What the first bytes are, in hex, with a text preview when they look like text."""
    if not data:
        return "empty value (0 bytes)"
    shown = f"first bytes 0x{data[:HEADER_LEN].hex()}"
    text = data[:HEADER_LEN].decode("utf-8", "replace")
    if text.isprintable():
        shown += f" ({text!r}: looks like text or JSON)"
    if len(data) < HEADER_LEN:
        shown += f", only {len(data)} bytes"
    return shown


def _preview(record: Any) -> Any:
    text = repr(record)
    return text if len(text) <= 200 else text[:197] + "..."


@lru_cache(maxsize=1)
def default_serde() -> Serde:
    """The process-wide Serde over the shipped schemas."""
    return Serde(default_registry())


def encode(kind: str, record: Mapping[str, Any] | Any, *, validate: bool = True) -> bytes:
    """Single-object Avro bytes of `record` with the current schema of `kind`."""
    return default_serde().encode(kind, record, validate=validate)


def decode(data: bytes, expected_kind: str | None = None) -> tuple[str, dict[str, Any]]:
    """(kind, record) from single-object Avro bytes written with any shipped schema version."""
    return default_serde().decode(data, expected_kind)


def validate(kind: str, record: Mapping[str, Any]) -> None:
    """Raise EncodeError (field path, value, problem) unless `record` fits the current `kind` schema."""
    default_serde().validate(kind, record)
