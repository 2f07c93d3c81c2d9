"""Router scorers: each maps one path estimate to a score in [0, 1] (1 = best).

Time and money are scored relative to the best candidate of this decision (best / this), so
the scores need no units and a path 4x slower than the best scores 0.25. The composite score
is the weighted mean with the weights of ``RouterConfig.weights`` (names match ``SCORERS``).
A scorer takes every candidate of the decision at once and returns one value per path (the
router scores every path of every request, so a column at a time keeps that cheap).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple

from .router_config import RouterConfig, ScorerWeights
from .types import PathEstimate, RequestWork


class FieldStats(NamedTuple):
    """What a relative scorer needs to know about all candidates of one decision."""

    best_total_s: float
    best_cost: float | None  # None when no candidate carries a price

    @classmethod
    def of(cls, estimates: Sequence[PathEstimate], totals: Sequence[float] | None = None) -> FieldStats:
        """``totals``: the estimates' ``total_s`` when the caller has them already."""
        costs = [e.cost for e in estimates if e.cost is not None]
        best_total = min(totals) if totals is not None else min(e.total_s for e in estimates)
        return cls(best_total, min(costs) if costs else None)


@dataclass(frozen=True)
class ScoreInput:
    """Every candidate path of one decision: scorers work a column at a time (one value per path)."""

    estimates: Sequence[PathEstimate]
    field: FieldStats
    request: RequestWork
    now: float
    config: RouterConfig
    totals: Sequence[float] = ()
    """Each path's ``total_s``, computed once (filled in when not given)."""

    def __post_init__(self) -> None:
        if len(self.totals) != len(self.estimates):
            object.__setattr__(self, "totals", [e.total_s for e in self.estimates])

    @classmethod
    def of(cls, estimates: Sequence[PathEstimate], request: RequestWork, now: float, config: RouterConfig) -> ScoreInput:
        """The input for scoring ``estimates`` against each other (the field is their own best)."""
        totals = [e.total_s for e in estimates]
        return cls(estimates, FieldStats.of(estimates, totals), request, now, config, totals)


def _ratios(best: float, values: Iterable[float | None], unknown: float) -> list[float]:
    """best / value for each value (``score_paths`` clamps them): 0 for an infinite value, 1
    for a free one, ``unknown`` for None."""
    isinf = math.isinf
    return [unknown if v is None else 0.0 if isinf(v) else 1.0 if v <= 0 else best / v for v in values]


def _clamped(values: list[float]) -> list[float]:
    """``values`` with each clamped to [0, 1] (NaN to 0); the list itself when all are in range."""
    # min and max skip a NaN that is not first; the sum of values in [0, 1] is NaN only with one
    if values and min(values) >= 0.0 and max(values) <= 1.0 and (total := sum(values)) == total:
        return values
    return [v if 0.0 <= v <= 1.0 else 1.0 if v > 1.0 else 0.0 for v in values]  # NaN fails both tests: 0


def completion(x: ScoreInput) -> list[float]:
    return _ratios(x.field.best_total_s, x.totals, 0.0)  # totals are never None


def cost(x: ScoreInput) -> list[float]:
    best = x.field.best_cost
    if best is None:
        return [1.0] * len(x.estimates)  # no pool carries a price: money does not separate the paths
    # unpriced among priced pools: neither free nor the most expensive
    return _ratios(best, [e.cost for e in x.estimates], 0.5)


def memory(x: ScoreInput) -> list[float]:
    return [e.memory_headroom for e in x.estimates]


def failure(x: ScoreInput) -> list[float]:
    return [e.success_prob for e in x.estimates]


def deadline(x: ScoreInput) -> list[float]:
    if x.request.deadline is None:
        return [1.0] * len(x.estimates)
    slack_at_now = x.request.deadline - x.now
    scale = 2.0 * x.config.deadline_slack_ref_s
    return [0.5 + (slack_at_now - total) / scale for total in x.totals]


def stall(x: ScoreInput) -> list[float]:
    ref = x.config.stall_ref_s
    return [1.0 / (1.0 + e.stall_s / ref) for e in x.estimates]


Scorer = Callable[[ScoreInput], list[float]]

SCORERS: tuple[tuple[str, Scorer], ...] = (
    ("completion", completion),
    ("cost", cost),
    ("memory", memory),
    ("failure", failure),
    ("deadline", deadline),
    ("stall", stall),
)

Columns = tuple[tuple[str, list[float]], ...]


@functools.lru_cache(maxsize=64)
def _active(weights: ScorerWeights) -> tuple[tuple[str, Scorer, float], ...]:
    """The scorers with a weight > 0, each with its weight normalised so the weights sum to 1."""
    total = sum(getattr(weights, name) for name, _ in SCORERS if getattr(weights, name) > 0)
    return tuple((name, fn, getattr(weights, name) / total) for name, fn in SCORERS if getattr(weights, name) > 0)


def score_paths(x: ScoreInput) -> tuple[list[float], Columns]:
    """The weighted mean of every scorer with a weight > 0 for each path (in ``x.estimates``
    order), and the per-scorer values, clamped to [0, 1], as columns (``parts_of`` picks one path's)."""
    active = _active(x.config.weights)
    columns = tuple((name, _clamped(fn(x))) for name, fn, _ in active)
    # A column at a time, each path's sum in scorer order: the same additions as summing each
    # path's weighted values in turn, with one list pass per scorer instead of one call per path.
    totals = [0.0] * len(x.estimates)
    for (_, values), (_, _, weight) in zip(columns, active):
        totals = [t + weight * v for t, v in zip(totals, values)]
    return totals, columns


def parts_of(columns: Columns, i: int) -> tuple[tuple[str, float], ...]:
    """(scorer, value) for the ``i``-th path of a ``score_paths`` result."""
    return tuple((name, values[i]) for name, values in columns)


def score_path(x: ScoreInput) -> tuple[float, tuple[tuple[str, float], ...]]:
    """``score_paths`` of a single-path input: (weighted mean, per-scorer values)."""
    if len(x.estimates) != 1:
        raise ValueError(f"score_path takes one estimate, got {len(x.estimates)}; use score_paths")
    totals, columns = score_paths(x)
    return totals[0], parts_of(columns, 0)


def _check_registry() -> None:
    names = {name for name, _ in SCORERS}
    weight_names = {f.name for f in fields(RouterConfig().weights)}
    if names != weight_names:
        raise RuntimeError(f"SCORERS {sorted(names)} and ScorerWeights {sorted(weight_names)} disagree")


_check_registry()
