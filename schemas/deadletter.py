"""Turning a message that cannot be used into a `dead_letter` record, and decoding without ever
raising: garbage in, a dead letter with a precise reason out.

A consumer loop does::

    out = safe_decode(msg.value(), msg.key(), topic=msg.topic(), partition=msg.partition(),
                      offset=msg.offset(), service="admission", now_ms=now_ms, expected_kind="job_submitted")
    if isinstance(out, Rejected):
        producer.produce("deadletter", key=msg.topic(), value=encode("dead_letter", out.dead_letter))
    else:
        handle(out.kind, out.record)

and a record that decodes but breaks a rule (VALIDATE) or makes the handler fail (PROCESS)
goes through `to_dead_letter` with that stage.
"""

from __future__ import annotations

import traceback as _traceback
from typing import Any, NamedTuple

from phaseroute.schemas.enums import DeadLetterStage
from phaseroute.schemas.errors import DecodeError, SchemaError, TombstoneError
from phaseroute.schemas.serde import Serde, default_serde

MAX_REASON_CHARS = 2_000
MAX_TRACEBACK_CHARS = 16_000


class Decoded(NamedTuple):
    kind: str
    record: dict[str, Any]


class Rejected(NamedTuple):
    dead_letter: dict[str, Any]  # a dead_letter record, ready for encode("dead_letter", ...)
    error: BaseException


def to_dead_letter(
    raw_value: Any,
    raw_key: Any,
    topic: str,
    partition: int | None,
    offset: int | None,
    error: BaseException,
    stage: DeadLetterStage | str | None,
    service: str,
    now_ms: int,
    *,
    expected_kind: str | None = None,
    error_class: str | None = None,
) -> dict[str, Any]:
    """A `dead_letter` record for a message, with a reason naming what was wrong and where.

    stage None means DECODE for decode errors and PROCESS otherwise. A traceback is kept for
    PROCESS failures. error_class overrides the exception's class name (for example a rule
    name such as DeadlineTooSoon) in the record and in the reason. Never raises for odd
    inputs (a str value, a None partition...).
    """
    error_class = error_class or type(error).__name__
    if stage is None:
        stage = DeadLetterStage.DECODE if isinstance(error, DecodeError) else DeadLetterStage.PROCESS
    stage = DeadLetterStage(stage)
    where = f"topic {topic} partition {_int(partition)} offset {_int(offset)}"
    what = str(error) if isinstance(error, SchemaError) else f"{error_class}: {error}"
    reason = f"{what} (read from {where})"
    return {
        "source_topic": str(topic),
        "partition": _int(partition),
        "offset": _int(offset),
        "key": _bytes_or_none(raw_key),
        "value": _bytes_or_none(raw_value),
        "reason": _cut(reason, MAX_REASON_CHARS),
        "error_class": error_class,
        "stage": stage.value,
        "expected_kind": expected_kind,
        "traceback": _traceback_of(error) if stage is DeadLetterStage.PROCESS else None,
        "service": str(service),
        "at": int(now_ms),
    }


def safe_decode(
    raw_value: Any,
    raw_key: Any = None,
    *,
    topic: str,
    partition: int | None,
    offset: int | None,
    service: str,
    now_ms: int,
    expected_kind: str | None = None,
    serde: Serde | None = None,
) -> Decoded | Rejected:
    """Decoded(kind, record), or Rejected(dead_letter, error) for anything that does not decode.

    A tombstone (value None) is rejected too: callers of compacted topics where tombstones are
    legitimate check for None first.
    """
    try:
        if raw_value is None:
            raise TombstoneError(f"tombstone (no value) where a {expected_kind or 'message'} was expected")
        kind, record = (serde or default_serde()).decode(raw_value, expected_kind)
        return Decoded(kind, record)
    except Exception as exc:  # the point of this function: every failure becomes a dead letter
        letter = to_dead_letter(
            raw_value, raw_key, topic, partition, offset, exc, DeadLetterStage.DECODE, service, now_ms,
            expected_kind=expected_kind,
        )
        return Rejected(letter, exc)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _bytes_or_none(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8", "replace")
    return repr(value).encode("utf-8", "replace")


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 15] + " ...(truncated)"


def _traceback_of(error: BaseException) -> str | None:
    if error.__traceback__ is None:
        return None
    return _cut("".join(_traceback.format_exception(error)), MAX_TRACEBACK_CHARS)
