"""Errors of the schema layer. Every message names what was wrong: the kind, the field, the
value, the bytes or the fingerprint, so a dead-letter reason built from it is actionable."""

from __future__ import annotations

from typing import Any


class SchemaError(Exception):
    """A message does not fit the phaseroute Avro schemas."""


class SchemaLoadError(SchemaError):
    """An .avsc file is missing, malformed or inconsistent with its name."""


class UnknownKindError(SchemaError, LookupError):
    """A message kind that has no .avsc file."""

    def __init__(self, kind: str, known: tuple[str, ...]) -> None:
        self.kind = kind
        self.known = known
        super().__init__(f"unknown message kind {kind!r}; known kinds: {', '.join(known)}")


class EncodeError(SchemaError, ValueError):
    """A record does not fit its schema; `field` is a path like ``requests[3].max_tokens``."""

    def __init__(self, kind: str, field: str, value: Any, problem: str) -> None:
        self.kind = kind
        self.field = field
        self.value = value
        where = f"field {field} = {_show(value)}" if field else f"the record ({_show(value)})"
        super().__init__(f"record fails schema {kind}: {where} {problem}")


class DecodeError(SchemaError, ValueError):
    """Bytes that cannot be turned into a record of a known kind."""


class NotSingleObjectError(DecodeError):
    """The bytes do not start with the Avro single-object marker 0xC3 0x01 + fingerprint."""


class UnknownFingerprintError(DecodeError):
    """The writer schema's fingerprint is not any version this reader ships."""

    def __init__(self, fingerprint: int, message: str) -> None:
        self.fingerprint = fingerprint
        super().__init__(message)


class WrongKindError(DecodeError):
    """A valid message of another kind than the consumer expected."""

    def __init__(self, expected: str, actual: str, message: str) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(message)


class TombstoneError(DecodeError):
    """A message without a value where a record was expected."""


class CorruptBodyError(DecodeError):
    """The header is valid but the body is truncated, has trailing bytes or is garbage."""


def _show(value: Any, limit: int = 80) -> str:
    """repr of a value, cut to `limit` characters, with its type."""
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{text} ({type(value).__name__})"
