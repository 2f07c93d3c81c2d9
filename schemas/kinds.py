"""The one map from message kind (the .avsc file stem) to its typed record class."""

from __future__ import annotations

from typing import Any

from phaseroute.schemas.control_records import JobAdmission, LoadSnapshot
from phaseroute.schemas.errors import UnknownKindError
from phaseroute.schemas.ops_records import (
    AttemptFailed,
    DeadLetter,
    DriftMeasurement,
    PhaseTelemetry,
    PoolHeartbeat,
    ProfileRow,
    QualityAlert,
    Tenant,
)
from phaseroute.schemas.records import (
    DecodeWork,
    JobCommand,
    JobEvent,
    JobSubmitted,
    KvReady,
    OutputWritten,
    PrefillWork,
    Request,
    Result,
)
from phaseroute.schemas.typed import AvroRecord

RECORD_TYPES: dict[str, type[AvroRecord]] = {
    cls.KIND: cls
    for cls in (
        JobSubmitted, JobCommand, JobEvent, Request, PrefillWork, KvReady, DecodeWork, Result, OutputWritten,
        PhaseTelemetry, PoolHeartbeat, ProfileRow, DeadLetter, AttemptFailed, DriftMeasurement, QualityAlert,
        Tenant, JobAdmission, LoadSnapshot,
    )
}


def record_type(kind: str) -> type[AvroRecord]:
    """The typed record class of `kind`; UnknownKindError names the known kinds."""
    try:
        return RECORD_TYPES[kind]
    except KeyError:
        raise UnknownKindError(kind, tuple(sorted(RECORD_TYPES))) from None


def to_typed(kind: str, record: dict[str, Any]) -> AvroRecord:
    """The typed record for a decoded (kind, record) pair."""
    return record_type(kind).from_dict(record)
