"""Quality tiers over measured drift: when a path is demoted for EXACT work, when it recovers,
and what the router assumes about a path that has not been measured.

Life of a path's quality: the drift monitor runs canaries on (model, prefill pool, decode pool)
each round and hands the round's figures and the path's previous ``PathState`` to ``step``.
Thresholds (``QualityConfig``) decide pass or fail for the EXACT tier; hysteresis decides the
state::

    UNMEASURED --pass--> HEALTHY                  --fail--> DEMOTED (a path never trusted yet)
    HEALTHY    --fail x demote_after--> DEMOTED   (SUSPECT in between when demote_after > 1)
    SUSPECT    --pass--> HEALTHY
    DEMOTED    --recover-pass--> RECOVERING --recover-pass x recover_after--> HEALTHY
    RECOVERING --fails the recovery thresholds--> DEMOTED

Recovery thresholds are stricter than demotion thresholds (a band), so a path measured near a
threshold does not flap. Entering DEMOTED and returning to HEALTHY from it raise an alert. A
round that compared fewer than ``min_positions`` positions (canaries lost) decides nothing.
Greedy agreement is reported but not a threshold: one near-tie flipped by batching noise
changes every later greedy token, while teacher-forced figures move by one position.

The router asks ``path_quality`` for each candidate path: the measured row of the path when
there is one; otherwise, from the best measured path into the same decode pool and the best
out of the same prefill pool, the worse of the two (so an int8 decode pool is distrusted on
every path into it as soon as one path into it has failed, while a single corrupted link does
not taint its pools' other paths, which are measured on their own); None when neither pool
has a measured path. Measured rows do not expire: a demotion never lapses silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from phaseroute.schemas.enums import QualityAlertKind as QualityAlertKind
from phaseroute.schemas.enums import QualityState as QualityState

from . import _checks
from .types import PathQuality, ProfileTable


class DriftFigures(Protocol):
    """What one canary round measured (``engine.drift.DriftMetrics`` has these)."""

    @property
    def positions(self) -> int: ...
    @property
    def greedy_agreement(self) -> float: ...
    @property
    def top1_agreement(self) -> float: ...
    @property
    def mean_kl(self) -> float: ...
    @property
    def max_kl(self) -> float: ...


@dataclass(frozen=True)
class QualityConfig:
    """EXACT-tier thresholds (KL in nats, agreement as a share) and the hysteresis rules."""

    exact_max_mean_kl: float = 1e-6
    """Demote above this mean KL (nats). fp32 through the workers reads ~1e-11 (batching noise);
    bf16 ~1e-3, int8-weight ~5e-3, int8-dynamic ~0.1-0.7; a few flipped KV bits 1e-7 to 20."""
    exact_max_kl: float = 1e-4
    """Demote when any single position's KL is above this (fp32 noise: < 1e-8)."""
    exact_min_top1: float = 0.99
    """Demote below this teacher-forced top-1 agreement."""
    recover_max_mean_kl: float = 1e-8
    """A demoted path counts a passing round only below this mean KL (a band: no flapping)."""
    recover_max_kl: float = 1e-6
    recover_min_top1: float = 0.995
    demote_after: int = 1
    """Consecutive failing rounds that demote a HEALTHY path (1: the first failure demotes)."""
    recover_after: int = 3
    """Consecutive rounds passing the recovery thresholds that restore a DEMOTED path."""
    min_positions: int = 8
    """A round comparing fewer reference positions than this decides nothing."""

    def __post_init__(self) -> None:
        owner = "QualityConfig"
        for name in ("exact_max_mean_kl", "exact_max_kl", "recover_max_mean_kl", "recover_max_kl"):
            _checks.non_negative(owner, name, getattr(self, name))
        for name in ("exact_min_top1", "recover_min_top1"):
            _checks.fraction(owner, name, getattr(self, name))
        for name in ("demote_after", "recover_after", "min_positions"):
            _checks.at_least(owner, name, getattr(self, name), 1)
        if (self.recover_max_mean_kl > self.exact_max_mean_kl or self.recover_max_kl > self.exact_max_kl
                or self.recover_min_top1 < self.exact_min_top1):
            raise ValueError(f"{owner}: recovery thresholds must be at least as strict as demotion thresholds, got {self}")


@dataclass(frozen=True)
class PathState:
    state: QualityState = QualityState.UNMEASURED
    fails: int = 0  # consecutive failing rounds
    passes: int = 0  # consecutive rounds passing the recovery thresholds while demoted


@dataclass(frozen=True)
class QualityVerdict:
    """The path's state after a round, and the alert the round raised (if any)."""

    state: PathState
    decided: bool  # False: too few positions, the state is unchanged
    reason: str | None  # why the path is not HEALTHY (None when it is)
    alert: QualityAlertKind | None = None

    @property
    def exact_ok(self) -> bool:
        return self.state.state.exact_ok


def exact_failures(figures: DriftFigures, config: QualityConfig, recovering: bool = False) -> list[str]:
    """Which EXACT thresholds the round misses (the stricter recovery ones when ``recovering``)."""
    mean_kl, max_kl, top1 = ((config.recover_max_mean_kl, config.recover_max_kl, config.recover_min_top1) if recovering
                             else (config.exact_max_mean_kl, config.exact_max_kl, config.exact_min_top1))
    which = "recovery" if recovering else "EXACT"
    out = []
    if not figures.mean_kl <= mean_kl:  # written so that NaN fails
        out.append(f"mean KL {figures.mean_kl:.4g} nats > {mean_kl:g} ({which})")
    if not figures.max_kl <= max_kl:
        out.append(f"max KL {figures.max_kl:.4g} nats > {max_kl:g} ({which})")
    if not figures.top1_agreement >= top1:
        out.append(f"top-1 agreement {figures.top1_agreement:.3f} < {top1:g} ({which})")
    return out


def step(previous: PathState, figures: DriftFigures, config: QualityConfig) -> QualityVerdict:
    """The path's state after one canary round (see the module docstring)."""
    s = previous.state
    if figures.positions < config.min_positions:
        return QualityVerdict(previous, False, f"only {figures.positions} positions compared (< {config.min_positions}): no verdict")
    demoted = s in (QualityState.DEMOTED, QualityState.RECOVERING)
    failures = exact_failures(figures, config, recovering=demoted)
    if not failures and not demoted:
        return QualityVerdict(PathState(QualityState.HEALTHY), True, None)
    if not failures:
        passes = previous.passes + 1
        if passes >= config.recover_after:
            return QualityVerdict(PathState(QualityState.HEALTHY), True, None, QualityAlertKind.RECOVERED)
        return QualityVerdict(PathState(QualityState.RECOVERING, 0, passes), True,
                              f"recovering: {passes} of {config.recover_after} passing rounds")
    fails = previous.fails + 1
    reason = "; ".join(failures)
    if demoted:
        return QualityVerdict(PathState(QualityState.DEMOTED, fails, 0), True, reason)
    if s is QualityState.UNMEASURED or fails >= config.demote_after:
        return QualityVerdict(PathState(QualityState.DEMOTED, fails, 0), True,
                              f"{reason} in {fails} consecutive round(s)", QualityAlertKind.DEMOTED)
    return QualityVerdict(PathState(QualityState.SUSPECT, fails, 0), True, f"{reason} ({fails} of {config.demote_after} rounds)")


def _best(rows: list[PathQuality]) -> PathQuality | None:
    return max(rows, key=lambda q: (q.exact_ok, q.score, q.updated_at), default=None)


def _infer(table: ProfileTable, model: str, src: str, dst: str) -> PathQuality | None:
    measured = table.quality.get((model, src, dst))
    if measured is not None:
        return measured
    rows = [q for q in table.quality.values() if q.model == model]
    evidence = [e for e in (_best([q for q in rows if q.dst == dst]), _best([q for q in rows if q.src == src])) if e]
    if not evidence:
        return None
    worst = min(evidence, key=lambda q: (q.exact_ok, q.score))
    return PathQuality(model, src, dst, worst.score, worst.exact_ok, 0, max(e.updated_at for e in evidence))


def path_quality(table: ProfileTable, model: str, src: str, dst: str, now: float) -> PathQuality | None:
    """The quality the router assumes for prefill on ``src`` and decode on ``dst`` (``samples``
    is 0 when inferred from other paths); None when nothing about either pool is measured."""
    if not table.quality:
        return None
    return table.memo(("path_quality", model, src, dst), now, lambda: _infer(table, model, src, dst))
