"""Python mirrors of the Avro enums (tests/schemas/test_typed.py keeps them equal).

Each is a StrEnum whose values are the Avro symbols, so a member can go straight into a record
dict and ``record["state"] == JobState.RUNNING`` holds for a decoded dict.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class QualityTier(StrEnum):
    """What a job accepts: EXACT (reference-quality paths only) or APPROXIMATE (down to a tolerance)."""

    EXACT = "EXACT"
    APPROXIMATE = "APPROXIMATE"


class JobCommandKind(StrEnum):
    CANCEL = "CANCEL"


class JobEventKind(StrEnum):
    SUBMITTED = "SUBMITTED"
    ADMITTED = "ADMITTED"
    REJECTED = "REJECTED"
    RUNNING = "RUNNING"
    PROGRESS = "PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"


class JobState(StrEnum):
    """The job life cycle, ordered by stage:

    SUBMITTED (0) < ADMITTED | REJECTED (1) < RUNNING (2) < COMPLETED | FAILED | CANCELLED | EXPIRED (3)

    Comparisons use the stage, so ``state >= JobState.COMPLETED`` is true for every state of
    the last stage, and two states of one stage are neither < nor > each other. Plain strings
    (a decoded record's field) compare too: ``"FAILED" >= JobState.COMPLETED``. Use
    `is_finished` for "no more changes" (it includes REJECTED) and `can_move_to` to refuse a
    transition backwards or out of a final state.
    """

    SUBMITTED = "SUBMITTED"
    ADMITTED = "ADMITTED"
    REJECTED = "REJECTED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    EXPIRED = "EXPIRED"

    @property
    def stage(self) -> int:
        return _JOB_STAGE[self.value]

    @property
    def is_finished(self) -> bool:
        return self.value in _JOB_FINAL

    def can_move_to(self, new: JobState | str) -> bool:
        """True when `new` is a legal next state: a later stage, from a state that is not final."""
        return not self.is_finished and _job_state(new).stage > self.stage

    def __lt__(self, other: Any) -> bool:
        return self.stage < _job_state(other).stage

    def __le__(self, other: Any) -> bool:
        return self.stage <= _job_state(other).stage

    def __gt__(self, other: Any) -> bool:
        return self.stage > _job_state(other).stage

    def __ge__(self, other: Any) -> bool:
        return self.stage >= _job_state(other).stage


_JOB_STAGE = {
    "SUBMITTED": 0,
    "ADMITTED": 1,
    "REJECTED": 1,
    "RUNNING": 2,
    "COMPLETED": 3,
    "FAILED": 3,
    "CANCELLED": 3,
    "EXPIRED": 3,
}
_JOB_FINAL = frozenset({"REJECTED", "COMPLETED", "FAILED", "CANCELLED", "EXPIRED"})


def _job_state(value: Any) -> JobState:
    if isinstance(value, JobState):
        return value
    if isinstance(value, str):
        return JobState(value)  # ValueError names an unknown state
    raise TypeError(f"cannot compare a JobState with {value!r} ({type(value).__name__})")


class ResultStatus(StrEnum):
    OK = "OK"
    FAILED = "FAILED"


class FinishReason(StrEnum):
    STOP = "STOP"
    LENGTH = "LENGTH"
    ERROR = "ERROR"


class TelemetryPhase(StrEnum):
    """Kind of measured work in telemetry records (Avro ``phaseroute.Phase``): a request phase,
    or colocated prefill+decode, or a KV transfer."""

    PREFILL = "PREFILL"
    DECODE = "DECODE"
    COLOCATED = "COLOCATED"
    TRANSFER = "TRANSFER"


class BatchStatus(StrEnum):
    OK = "OK"
    ERROR = "ERROR"


class PoolPhase(StrEnum):
    PREFILL = "PREFILL"
    DECODE = "DECODE"
    BOTH = "BOTH"


class WorkerStatus(StrEnum):
    UP = "UP"
    DRAINING = "DRAINING"
    DOWN = "DOWN"


class Phase(StrEnum):
    """The two phases of a request (Avro ``phaseroute.AttemptPhase``): the prompt
    (compute-bound) and the output tokens (memory-bound). The one definition: the policy, the
    control core, the workers and the simulator all use this enum."""

    PREFILL = "PREFILL"
    DECODE = "DECODE"

    @property
    def slug(self) -> str:
        """The phase as it appears in attempt ids and log text: ``prefill`` / ``decode``."""
        return self.value.lower()


class ProfileSource(StrEnum):
    """Where a profile row came from; TELEMETRY is blended toward PROFILER, PROFILER toward DATASHEET."""

    PROFILER = "PROFILER"
    TELEMETRY = "TELEMETRY"
    DATASHEET = "DATASHEET"


class DeadLetterStage(StrEnum):
    DECODE = "DECODE"
    VALIDATE = "VALIDATE"
    PROCESS = "PROCESS"


class CanaryMode(StrEnum):
    GREEDY = "GREEDY"
    FORCED = "FORCED"


class QualityState(StrEnum):
    """A path's quality state under measured drift (``streams/policy/quality.py`` moves it)."""

    UNMEASURED = "UNMEASURED"
    HEALTHY = "HEALTHY"
    SUSPECT = "SUSPECT"  # failed, not yet demote_after times in a row
    DEMOTED = "DEMOTED"
    RECOVERING = "RECOVERING"  # demoted, passing toward recover_after

    @property
    def exact_ok(self) -> bool:
        return self not in (QualityState.DEMOTED, QualityState.RECOVERING)


class QualityAlertKind(StrEnum):
    DEMOTED = "DEMOTED"
    RECOVERED = "RECOVERED"


#: Avro enum full name -> Python enum, for the drift test and generic conversion. Two Python
#: names differ from their Avro names: the request phase (Avro AttemptPhase) is ``Phase``, the
#: telemetry kind (Avro Phase) is ``TelemetryPhase``.
AVRO_ENUMS: dict[str, type[StrEnum]] = {
    "phaseroute.Phase": TelemetryPhase,
    "phaseroute.AttemptPhase": Phase,
} | {
    f"phaseroute.{cls.__name__}": cls
    for cls in (
        QualityTier, JobCommandKind, JobEventKind, JobState, ResultStatus, FinishReason,
        BatchStatus, PoolPhase, WorkerStatus, ProfileSource, DeadLetterStage,
        CanaryMode, QualityState, QualityAlertKind,
    )
}
