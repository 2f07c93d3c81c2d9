"""Pure decisions (no I/O, no Faust, no clock reads: time is an argument) shared by the live agents and the simulator.

Modules, one job each:
``types`` (plain data), ``lifecycle`` (status enums, attempt ids), ``confidence`` (trust in
profile rows, effective rows), ``profile_builder`` (telemetry aggregates -> rows),
``cost_model`` (seconds, bytes, dollars of a placement), ``filters`` / ``scorers`` /
``router`` / ``router_config`` / ``router_state`` (placement and anti-herding),
``admission`` + ``feasibility`` (admit or reject), ``fairness`` (VTC release),
``retry`` (retries, stragglers), ``pool_loss`` (re-dispatch after a pool dies), ``quality``
(EXACT-tier demotion and recovery from measured drift, path quality for the router).
The contract is docs/policy-contract.md.
"""

from .admission import (
    AdmissionConfig,
    Admitted,
    BacklogJob,
    JobSpec,
    ModelSpec,
    RejectCode,
    Rejected,
    TenantQuota,
    admit,
    format_time,
    request_id,
    split_job,
)
from .confidence import ConfidenceConfig, EffectiveProfile, confidence, effective_link, effective_profile
from .cost_model import PhaseOption, estimate_path, fleet_tokens_per_s, join_batch, service_time, transfer_time
from .fairness import FairConfig, FairScheduler, FreeCapacity, Release, SchedulerOutput, TenantReport
from .feasibility import QueuedWork, check_deadline, earliest_feasible_deadline
from .filters import measured_quality_refusal
from .lifecycle import AttemptStatus, FailureKind, attempt_id, job_transition_error, parse_attempt_id
from .pool_loss import InFlightAttempt, Redispatch, dead_pools, redispatch_lost
from .profile_builder import (
    LinkAggregate,
    PhaseAggregate,
    ProfileBuilderConfig,
    build_link_profiles,
    build_profile_rows,
)
from .quality import (
    PathState,
    QualityAlertKind,
    QualityConfig,
    QualityState,
    QualityVerdict,
    path_quality,
)
from .retry import (
    AttemptRecord,
    GiveUp,
    Retry,
    RetryConfig,
    RunningAttempt,
    SpeculativeCopy,
    backoff_delay,
    find_stragglers,
    give_up_unplaced,
    is_straggler,
    next_step,
    straggler_limit_s,
    straggler_threshold_s,
)
from .router import route
from .router_config import RouterConfig, ScorerWeights
from .router_state import RouterState, ShareUpdate
from .types import (
    CurvePoint,
    LinkProfile,
    NoPlacement,
    PathEstimate,
    PathQuality,
    Phase,
    PoolState,
    ProfileRow,
    ProfileSource,
    ProfileTable,
    QualityTier,
    RequestWork,
    RoutingDecision,
)

__all__ = [
    "AdmissionConfig",
    "Admitted",
    "AttemptRecord",
    "AttemptStatus",
    "BacklogJob",
    "ConfidenceConfig",
    "CurvePoint",
    "EffectiveProfile",
    "FailureKind",
    "FairConfig",
    "FairScheduler",
    "FreeCapacity",
    "GiveUp",
    "InFlightAttempt",
    "JobSpec",
    "LinkAggregate",
    "LinkProfile",
    "ModelSpec",
    "NoPlacement",
    "PathEstimate",
    "PathQuality",
    "PathState",
    "Phase",
    "PhaseAggregate",
    "PhaseOption",
    "PoolState",
    "ProfileBuilderConfig",
    "ProfileRow",
    "ProfileSource",
    "ProfileTable",
    "QualityAlertKind",
    "QualityConfig",
    "QualityState",
    "QualityTier",
    "QualityVerdict",
    "QueuedWork",
    "Redispatch",
    "RejectCode",
    "Rejected",
    "Release",
    "RequestWork",
    "Retry",
    "RetryConfig",
    "RouterConfig",
    "RouterState",
    "RoutingDecision",
    "RunningAttempt",
    "SchedulerOutput",
    "ScorerWeights",
    "ShareUpdate",
    "SpeculativeCopy",
    "TenantQuota",
    "TenantReport",
    "admit",
    "attempt_id",
    "backoff_delay",
    "build_link_profiles",
    "build_profile_rows",
    "check_deadline",
    "confidence",
    "dead_pools",
    "earliest_feasible_deadline",
    "effective_link",
    "effective_profile",
    "estimate_path",
    "find_stragglers",
    "format_time",
    "fleet_tokens_per_s",
    "give_up_unplaced",
    "is_straggler",
    "job_transition_error",
    "join_batch",
    "measured_quality_refusal",
    "next_step",
    "parse_attempt_id",
    "path_quality",
    "redispatch_lost",
    "request_id",
    "route",
    "service_time",
    "split_job",
    "straggler_limit_s",
    "straggler_threshold_s",
    "transfer_time",
]
