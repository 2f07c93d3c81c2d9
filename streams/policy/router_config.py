"""Weights and thresholds of the router (filters, scorers, picker, anti-herding shares).

Every knob the router uses lives here with its default and the reason for it; the logic in
``filters``, ``scorers``, ``router`` and ``router_state`` hard-codes none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from . import _checks
from .confidence import ConfidenceConfig


@dataclass(frozen=True)
class ScorerWeights:
    """Weight of each scorer in the weighted mean (0 switches a scorer off)."""

    completion: float = 1.0
    """Estimated completion time (queueing + service + transfer), relative to the best path."""
    cost: float = 0.25
    """Dollars for the request, relative to the cheapest path (neutral when pools carry no price)."""
    memory: float = 0.1
    """KV memory headroom left on the tighter pool of the path."""
    failure: float = 0.5
    """Probability that both phases succeed, from measured error rates."""
    deadline: float = 0.5
    """Slack between the estimated completion and the request's deadline."""
    stall: float = 0.2
    """Decode-seconds that this prefill would stall on a pool that also decodes."""

    def __post_init__(self) -> None:
        for f in fields(self):
            _checks.non_negative("ScorerWeights", f.name, getattr(self, f.name))
        if sum(getattr(self, f.name) for f in fields(self)) <= 0:
            raise ValueError(f"ScorerWeights must have at least one weight > 0, got {self}")


@dataclass(frozen=True)
class RouterConfig:
    weights: ScorerWeights = field(default_factory=ScorerWeights)
    confidence: ConfidenceConfig = field(default_factory=ConfidenceConfig)
    exact_quality_threshold: float = 0.99
    """EXACT requests only go to paths whose quality score (product over phases) is at least this."""
    max_error_rate: float = 0.5
    """Pools whose effective error rate for the phase is at least this get no work at all."""
    exploration_share: float = 0.05
    """Share of decisions that pick a uniformly random eligible pool, so every pool stays measured."""
    allow_disaggregation: bool = True
    """Consider prefill and decode on different pools (KV moved over the link)."""
    disaggregation_candidates: int = 4
    """Disaggregated pairs are built among this many best prefill and decode pools (plus one pair
    per other pool); 0 builds every pair (O(pools^2) estimates per request)."""
    heartbeat_timeout_s: float = 10.0
    """A pool whose last heartbeat is older than this is treated as dead: the one timeout the pool
    view, dead-pool detection and the router all read (workers beat every 2 s)."""
    deadline_slack_ref_s: float = 60.0
    """Slack at which the deadline scorer saturates: +ref -> 1, 0 -> 0.5, -ref -> 0."""
    stall_ref_s: float = 30.0
    """Decode-seconds of stall at which the stall scorer gives 0.5."""
    max_share_step: float = 0.1
    """Anti-herding: the most one profile refresh may move any pool's target traffic share."""
    share_slack: float = 0.02
    """A pool may take this fraction of the recent traffic beyond its target share before the
    picker passes it over (the room per-request scores get to bend the split)."""
    share_half_life_s: float = 60.0
    """Half-life of the decayed token counts and deficit credits behind the shares."""
    share_sharpness: float = 1.0
    """Target share is proportional to useful capacity ** sharpness (1 = proportional)."""
    relax_avoid_when_empty: bool = True
    """If the request's avoid list leaves no pool, place it on an avoided pool rather than nowhere."""
    transfer_usd_per_gb: float = 0.0
    """Dollars per GB of KV moved between two pools (egress between sites or zones; 0 when the
    pools share a network that costs nothing per byte). Added to a disaggregated path's dollars,
    so the cost scorer weighs it against the time disaggregation saves."""
    walk_transfer_share: float = 0.1
    """When the picker walks away from the best-scored path (an exploration pick, or the best's
    pool above its traffic share), it takes no path whose KV transfer costs more than the best
    path's own transfer plus this share of the best path's dollars: measuring a pool or spreading
    load is worth a little money, not a transfer dearer than the work (no effect when transfer
    is free)."""
    relax_room_when_empty: bool = True
    """If no pool has a worker with room for the request's KV now, queue it on a pool that can
    hold it once room frees rather than place it nowhere (a large request would otherwise
    bounce while smaller ones keep filling the workers)."""

    def __post_init__(self) -> None:
        owner = "RouterConfig"
        for name in ("exact_quality_threshold", "max_error_rate", "exploration_share", "max_share_step", "share_slack"):
            _checks.fraction(owner, name, getattr(self, name))
        _checks.non_negative(owner, "disaggregation_candidates", self.disaggregation_candidates)
        _checks.non_negative(owner, "transfer_usd_per_gb", self.transfer_usd_per_gb)
        _checks.finite(owner, "transfer_usd_per_gb", self.transfer_usd_per_gb)
        _checks.non_negative(owner, "walk_transfer_share", self.walk_transfer_share)
        _checks.finite(owner, "walk_transfer_share", self.walk_transfer_share)
        for name in ("max_error_rate", "max_share_step"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{owner}.{name} must be > 0, got {getattr(self, name)!r}")
        for name in (
            "heartbeat_timeout_s",
            "deadline_slack_ref_s",
            "stall_ref_s",
            "share_half_life_s",
            "share_sharpness",
        ):
            _checks.positive(owner, name, getattr(self, name))
