"""The control core's configuration: the policy configs and the core's own knobs, one place each.

The heartbeat timeout lives in ``RouterConfig.heartbeat_timeout_s`` (the pool view, dead-pool
detection and the router read that one value); the tick period, slots per worker, failure
window and back-off of unplaced requests live here. The live shell and the simulator build the
same ``CoreConfig``; only tenants and models differ by deployment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from phaseroute.schemas.ids import CANARY_TENANT
from phaseroute.streams.policy import (
    AdmissionConfig,
    FairConfig,
    ModelSpec,
    RetryConfig,
    RouterConfig,
    TenantQuota,
    _checks,
)


@dataclass(frozen=True)
class CoreConfig:
    models: Mapping[str, ModelSpec] = field(default_factory=dict)
    """Models this deployment serves (name -> context length)."""
    router: RouterConfig = field(default_factory=RouterConfig)
    fair: FairConfig = field(default_factory=FairConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    quotas: Mapping[str, TenantQuota] = field(default_factory=dict)
    tick_s: float = 0.25
    """Period of the dispatch tick (the Faust timer; the simulator ticks at the same period)."""
    max_releases_per_tick: int = 24
    """A tick releases and routes at most this many requests, so that one tick holds the caller
    (the control plane's event loop) for a bounded time: about this many times the router's cost
    per request (~0.2 ms). A tick that stopped at the cap sets ``ControlCore.more_to_release``;
    the caller ticks again at once (the live shell after yielding to its event loop, the
    simulators at the same instant), so the cap slices the work without slowing it."""
    forget_per_step: int = 1000
    """A finished job's requests leave the state and the store (two tombstones each: the request
    and its prompt text) at most this many per event or tick, the rest on the next ticks (about
    60 ms a slice in the live control plane): forgetting a 50,000-request job at once held its
    event loop for about 4 s."""
    early_event_ttl_s: float = 600.0
    """A result, receipt or cancel of a job whose verdict the tracker has not read yet waits this
    long for it (in memory): the admission desk sends the verdict before the job's requests, but
    the tracker reads ``jobs.admissions`` apart from the other topics."""
    finished_job_ttl_s: float = 3600.0
    """The job tracker and the dispatcher keep a finished job whose output is whole (and a
    rejected one) this long (a late receipt, cancel or replayed request finds it finished), then
    drop it and tombstone its stored record: their state grows with the jobs of the last hour,
    not with history."""
    slots_per_worker: int = 1
    """Dispatched-but-unfinished requests per row of a worker's batch (backpressure)..."""
    kv_in_flight_factor: float = 1.5
    """...and their tokens at most this many times what the decode pools' KV memory holds."""
    failure_window_s: float = 600.0
    """A pool's recent failures are those of the last this-many seconds."""
    unplaced_backoff_s: float = 1.0
    """A request no pool can place waits this long before it is queued again..."""
    unplaced_backoff_max_s: float = 5.0
    """...doubling per refusal up to this."""
    straggler_recheck_s: float = 10.0
    """An attempt with no profile to judge it by is looked at again after this long."""
    progress_every: int = 5
    """A PROGRESS job event every this many finished requests."""
    expire_after_deadline_s: float | None = 3600.0
    """A job unfinished this long after its deadline expires (its open requests fail with
    ``batch_expired``); None: jobs never expire."""
    resend_after_restart_s: float = 10.0
    """A restarted core sends again the attempts it dispatched this recently (the send may not
    have left before the stop; a second copy of the same attempt is deduplicated downstream)."""
    canary_tenant: str = CANARY_TENANT
    """The reserved tenant of the drift monitor's canaries: released by the fair scheduler like any
    other tenant's work, at a weight that keeps its share small..."""
    canary_share: float = 0.03
    """...at most this share of the tokens released while any other tenant's work is queued or
    running (a token cap over the fair scheduler's ``share_window_s``, and the weight that gives
    this share against a tenant of the smallest weight; more only when the fleet has nothing
    else)..."""
    canary_max_in_flight: int = 4
    """...and at most this many canaries in flight at once."""
    greedy_only: bool = True
    """The backend decodes greedily only: a job with temperature > 0 is rejected."""

    def __post_init__(self) -> None:
        owner = "CoreConfig"
        _checks.positive(owner, "tick_s", self.tick_s)
        _checks.at_least(owner, "max_releases_per_tick", self.max_releases_per_tick, 1)
        _checks.at_least(owner, "forget_per_step", self.forget_per_step, 1)
        _checks.at_least(owner, "slots_per_worker", self.slots_per_worker, 1)
        _checks.positive(owner, "early_event_ttl_s", self.early_event_ttl_s)
        _checks.positive(owner, "finished_job_ttl_s", self.finished_job_ttl_s)
        _checks.positive(owner, "kv_in_flight_factor", self.kv_in_flight_factor)
        _checks.positive(owner, "failure_window_s", self.failure_window_s)
        _checks.positive(owner, "unplaced_backoff_s", self.unplaced_backoff_s)
        _checks.at_least(owner, "unplaced_backoff_max_s", self.unplaced_backoff_max_s, self.unplaced_backoff_s)
        _checks.positive(owner, "straggler_recheck_s", self.straggler_recheck_s)
        _checks.non_negative(owner, "resend_after_restart_s", self.resend_after_restart_s)
        _checks.at_least(owner, "progress_every", self.progress_every, 1)
        if not 0.0 < self.canary_share < 1.0:
            raise ValueError(f"{owner}.canary_share must be in (0, 1), got {self.canary_share!r}")
        _checks.at_least(owner, "canary_max_in_flight", self.canary_max_in_flight, 1)
        if self.expire_after_deadline_s is not None:
            _checks.non_negative(owner, "expire_after_deadline_s", self.expire_after_deadline_s)

    def fair_with_canaries(self, fair: FairConfig | None = None) -> FairConfig:
        """``fair`` (default: this config's) with the canary tenant's weight, in-flight cap and token share."""
        fair = fair or self.fair
        smallest = min([*fair.tenant_weights.values(), fair.default_weight])
        weight = smallest * self.canary_share / (1.0 - self.canary_share)
        return replace(fair, tenant_weights={**fair.tenant_weights, self.canary_tenant: weight},
                       tenant_max_in_flight={**fair.tenant_max_in_flight, self.canary_tenant: self.canary_max_in_flight},
                       tenant_max_token_share={**fair.tenant_max_token_share, self.canary_tenant: self.canary_share})

    @property
    def heartbeat_timeout_s(self) -> float:
        return self.router.heartbeat_timeout_s

    def unplaced_backoff(self, tries: int) -> float:
        """Wait before queueing again a request refused ``tries`` times in a row."""
        return min(self.unplaced_backoff_s * 2.0 ** min(tries - 1, 30), self.unplaced_backoff_max_s)
