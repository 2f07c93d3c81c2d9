"""Which placements the router estimates: every colocated path, and disaggregated pairs.

With P prefill and D decode pools there are P x D disaggregated pairs; estimating and scoring
them all costs O(P x D) per request. When ``RouterConfig.disaggregation_candidates`` = K > 0,
only pairs among the K best prefill pools and the K best decode pools (by the phase's own
queue + service seconds, and by its dollars when pools carry prices) are built, plus, for
every other eligible pool, one pair with the best partner, so each pool still appears in some
path (exploration and the anti-herding budget need that). The best pair is kept unless a pool
outside both top-K lists would win only through a far better link, which links rarely make up.

The inputs are per-phase costs (``cost_model.PhaseCost``), computed once per pool and phase.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .cost_model import PhaseCost
from .router_config import RouterConfig

Pair = tuple[PhaseCost, PhaseCost]
P = TypeVar("P")
D = TypeVar("D")


def _name(c: PhaseCost) -> str:
    return c.option.pool.name


def _top(costs: list[PhaseCost], key: Callable[[PhaseCost], float | None], k: int) -> list[PhaseCost]:
    scored = [(v, _name(c), c) for c in costs if (v := key(c)) is not None]
    return [c for _, _, c in sorted(scored, key=lambda t: (t[0], t[1]))[:k]]


def _shortlist(costs: list[PhaseCost], k: int) -> dict[str, PhaseCost]:
    chosen = _top(costs, lambda c: c.seconds, k) + _top(costs, lambda c: c.dollars, k)
    return {_name(c): c for c in chosen}


def prunes(n_prefill: int, n_decode: int, config: RouterConfig) -> bool:
    """Whether ``candidate_pairs`` leaves some disaggregated pairs out for this many pools."""
    k = config.disaggregation_candidates
    return config.allow_disaggregation and k != 0 and not (n_prefill <= k and n_decode <= k)


def every_pair(prefill: list[tuple[str, P]], decode: list[tuple[str, D]], disaggregate: bool) -> list[tuple[P, D]]:
    """Every pair of (name, item) lists with distinct names, in ``candidate_pairs``' order: the
    colocated ones (same name) in prefill order, then, when ``disaggregate``, every other
    pair, prefill-major."""
    by_decode = dict(decode)
    pairs = [(p, by_decode[a]) for a, p in prefill if a in by_decode]
    if disaggregate:
        pairs += [(p, d) for a, p in prefill for b, d in decode if a != b]
    return pairs


def candidate_pairs(prefill: list[PhaseCost], decode: list[PhaseCost], config: RouterConfig) -> list[Pair]:
    """(prefill cost, decode cost) pairs to estimate, colocated ones first, without duplicates."""
    by_prefill = {_name(c): c for c in prefill}
    by_decode = {_name(c): c for c in decode}
    if not prunes(len(prefill), len(decode), config):
        return every_pair(list(by_prefill.items()), list(by_decode.items()), config.allow_disaggregation)
    k = config.disaggregation_candidates
    pairs: dict[tuple[str, str], Pair] = {
        (name, name): (p, by_decode[name]) for name, p in by_prefill.items() if name in by_decode
    }
    top_p, top_d = _shortlist(prefill, k), _shortlist(decode, k)
    for a, p in top_p.items():
        for b, d in top_d.items():
            if a != b:
                pairs.setdefault((a, b), (p, d))
    covered = {name for key in pairs for name in key}
    best_p = sorted(top_p.values(), key=lambda c: (c.seconds, _name(c)))
    best_d = sorted(top_d.values(), key=lambda c: (c.seconds, _name(c)))
    for a, p in by_prefill.items():
        if a not in covered:
            partner = next((d for d in best_d if _name(d) != a), None)
            if partner is not None:
                pairs.setdefault((a, _name(partner)), (p, partner))
    for b, d in by_decode.items():
        if b not in covered:
            partner = next((p for p in best_p if _name(p) != b), None)
            if partner is not None:
                pairs.setdefault((_name(partner), b), (partner, d))
    return list(pairs.values())
