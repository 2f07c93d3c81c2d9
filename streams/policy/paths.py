"""Which placements the router estimates: every colocated path, and disaggregated pairs.

With P prefill and D decode pools there are P x D disaggregated pairs; estimating and scoring
them all costs O(P x D) per request. When ``RouterConfig.disaggregation_candidates`` = K > 0,
only pairs among the K best prefill pools and the K best decode pools (by the phase's own
queue + service seconds, and by its dollars when pools carry prices) are built, plus, for
every other eligible pool, one pair with the best partner, so each pool still appears in some
path (exploration and the anti-herding budget need that). The best pair is kept unless a pool
outside both top-K lists would win only through a far better link, which links rarely make up.
"""

from __future__ import annotations

from collections.abc import Callable

from .cost_model import PhaseOption, phase_dollars, phase_seconds
from .router_config import RouterConfig
from .types import RequestWork

Pair = tuple[PhaseOption, PhaseOption]


def _top(options: list[PhaseOption], key: Callable[[PhaseOption], float | None], k: int) -> list[PhaseOption]:
    scored = [(v, o.pool.name, o) for o in options if (v := key(o)) is not None]
    return [o for _, _, o in sorted(scored, key=lambda t: (t[0], t[1]))[:k]]


def _shortlist(request: RequestWork, options: list[PhaseOption], k: int) -> dict[str, PhaseOption]:
    def seconds(o: PhaseOption) -> float:
        return phase_seconds(request, o)

    def dollars(o: PhaseOption) -> float | None:
        return phase_dollars(request, o)

    chosen = _top(options, seconds, k) + _top(options, dollars, k)
    return {o.pool.name: o for o in chosen}


def candidate_pairs(
    request: RequestWork, prefill: list[PhaseOption], decode: list[PhaseOption], config: RouterConfig
) -> list[Pair]:
    """(prefill option, decode option) pairs to estimate, colocated ones first, without duplicates."""
    by_decode = {o.pool.name: o for o in decode}
    pairs: dict[tuple[str, str], Pair] = {}
    for p in prefill:
        if p.pool.name in by_decode:
            pairs[(p.pool.name, p.pool.name)] = (p, by_decode[p.pool.name])
    if not config.allow_disaggregation:
        return list(pairs.values())
    k = config.disaggregation_candidates
    if k == 0 or (len(prefill) <= k and len(decode) <= k):
        top_p, top_d = {o.pool.name: o for o in prefill}, dict(by_decode)
    else:
        top_p, top_d = _shortlist(request, prefill, k), _shortlist(request, decode, k)
    for p in top_p.values():
        for d in top_d.values():
            if p.pool.name != d.pool.name:
                pairs.setdefault((p.pool.name, d.pool.name), (p, d))
    covered = {name for key in pairs for name in key}
    best_p = sorted(top_p.values(), key=lambda o: (phase_seconds(request, o), o.pool.name))
    best_d = sorted(top_d.values(), key=lambda o: (phase_seconds(request, o), o.pool.name))
    for p in prefill:
        if p.pool.name not in covered:
            partner = next((d for d in best_d if d.pool.name != p.pool.name), None)
            if partner is not None:
                pairs.setdefault((p.pool.name, partner.pool.name), (p, partner))
    for d in decode:
        if d.pool.name not in covered:
            partner = next((p for p in best_p if p.pool.name != d.pool.name), None)
            if partner is not None:
                pairs.setdefault((partner.pool.name, d.pool.name), (partner, d))
    return list(pairs.values())
