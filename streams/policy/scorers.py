"""Router scorers: each maps one path estimate to a score in [0, 1] (1 = best).

Time and money are scored relative to the best candidate of this decision (best / this), so
the scores need no units and a path 4x slower than the best scores 0.25. The composite score
is the weighted mean with the weights of ``RouterConfig.weights`` (names match ``SCORERS``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from .router_config import RouterConfig
from .types import PathEstimate, RequestWork


@dataclass(frozen=True)
class FieldStats:
    """What a relative scorer needs to know about all candidates of one decision."""

    best_total_s: float
    best_cost: float | None  # None when no candidate carries a price

    @classmethod
    def of(cls, estimates: Sequence[PathEstimate]) -> FieldStats:
        costs = [e.cost for e in estimates if e.cost is not None]
        return cls(min(e.total_s for e in estimates), min(costs) if costs else None)


@dataclass(frozen=True)
class ScoreInput:
    estimate: PathEstimate
    field: FieldStats
    request: RequestWork
    now: float
    config: RouterConfig


def _clamp(value: float) -> float:
    return 0.0 if math.isnan(value) else min(1.0, max(0.0, value))


def _ratio(best: float, value: float) -> float:
    if math.isinf(value):
        return 0.0
    return 1.0 if value <= 0 else _clamp(best / value)


def completion(x: ScoreInput) -> float:
    return _ratio(x.field.best_total_s, x.estimate.total_s)


def cost(x: ScoreInput) -> float:
    if x.field.best_cost is None:
        return 1.0  # no pool carries a price: money does not separate the paths
    if x.estimate.cost is None:
        return 0.5  # unpriced among priced pools: neither free nor the most expensive
    return _ratio(x.field.best_cost, x.estimate.cost)


def memory(x: ScoreInput) -> float:
    return _clamp(x.estimate.memory_headroom)


def failure(x: ScoreInput) -> float:
    return _clamp(x.estimate.success_prob)


def deadline(x: ScoreInput) -> float:
    if x.request.deadline is None:
        return 1.0
    slack = x.request.deadline - (x.now + x.estimate.total_s)
    return _clamp(0.5 + slack / (2.0 * x.config.deadline_slack_ref_s))


def stall(x: ScoreInput) -> float:
    return 1.0 / (1.0 + x.estimate.stall_s / x.config.stall_ref_s)


Scorer = Callable[[ScoreInput], float]

SCORERS: tuple[tuple[str, Scorer], ...] = (
    ("completion", completion),
    ("cost", cost),
    ("memory", memory),
    ("failure", failure),
    ("deadline", deadline),
    ("stall", stall),
)


def score_path(x: ScoreInput) -> tuple[float, tuple[tuple[str, float], ...]]:
    """The weighted mean of every scorer with a weight > 0, and the per-scorer values."""
    weights = x.config.weights
    parts = tuple((name, _clamp(scorer(x))) for name, scorer in SCORERS if getattr(weights, name) > 0)
    total_weight = sum(getattr(weights, name) for name, _ in parts)
    return sum(getattr(weights, name) * value for name, value in parts) / total_weight, parts


def _check_registry() -> None:
    names = {name for name, _ in SCORERS}
    weight_names = {f.name for f in fields(RouterConfig().weights)}
    if names != weight_names:
        raise RuntimeError(f"SCORERS {sorted(names)} and ScorerWeights {sorted(weight_names)} disagree")


_check_registry()
