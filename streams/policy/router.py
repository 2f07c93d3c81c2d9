"""The router: filter -> estimate -> score -> pick, for one request.

1. Filter each pool per phase (``filters.POOL_FILTERS``): alive, serves the phase, model
   loaded, profiled, healthy, quality tier, KV memory (one worker can hold the request at
   all), room now (some worker has that much free now), not in the avoid list. When nothing
   passes, "room now" and then the avoid list are relaxed (``RouterConfig``), so a request
   queues where it can run rather than nowhere.
2. Cost each surviving pool's phase once (``cost_model.phase_cost``: queue wait, service,
   dollars, KV headroom, from the *effective* confidence-blended rows), then build paths
   (``paths.candidate_pairs``): colocated (one pool runs both phases) and, when allowed,
   disaggregated (prefill pool != decode pool, KV over the measured link). A path's estimate
   only adds up its two phase costs and the transfer (``cost_model.combine``); paths below the
   quality tier are dropped (the quality canaries measured on the path when there is one:
   ``quality.path_quality``). Steps 1-2 run for every pool and path of every request, so they
   are written for speed with the same results: ``phase_view.phase_costs`` filters and costs a
   phase from what it keeps per pool state for the table's ``now`` (the request-independent
   filters' verdict and cost inputs), then runs the request filters and the cost arithmetic
   (``filters.request_rejection``, ``cost_model.cost_from``); ``_candidates`` reads each
   pool's side of a path once and adds two sides up per path (``cost_model.path_estimate``,
   which ``combine`` is made of).
3. Score every path with the weighted scorers (each in [0, 1]; a column of values at a time).
4. Pick: with probability ``exploration_share`` a uniformly random eligible pool (the best
   path through it), so every pool stays measured; otherwise the best path whose pools have
   not run ahead of their target traffic share in ``state`` (the best overall if none is).
   Ties go to the pool owed the most share. Neither walk away from the best path goes to a path
   whose KV transfer costs more than the best's by over ``walk_transfer_share`` of its dollars.
Colocate-vs-disaggregate is simply which kind of path wins: disaggregation wins when a
faster/cheaper decode pool plus the KV transfer beats running both phases on one pool, or
when prefill would stall many decodes on a shared pool.

``route`` does not change ``state``: the caller calls ``state.record(decision, request, now,
config)`` once it acts on the decision.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

from .confidence import ConfidenceConfig, effective_link
from .cost_model import DecodeSide, PhaseCost, PrefillSide, decode_side, path_estimate, prefill_side, transfer_dollars
from .filters import kv_handover, path_filter, required_quality
from .paths import candidate_pairs, every_pair, prunes
from .phase_view import phase_costs
from .quality import path_quality
from .router_config import RouterConfig
from .router_state import RouterState
from .scorers import FieldStats, ScoreInput, parts_of, score_paths
from .types import (
    LinkProfile,
    NoPlacement,
    PathEstimate,
    Phase,
    PoolState,
    ProfileTable,
    RequestWork,
    RoutingDecision,
)


def _links(profiles: ProfileTable, now: float, confidence: ConfidenceConfig) -> dict[tuple[str, str], LinkProfile]:
    """The effective links looked up at ``now`` (filled as paths need them): one memo lookup per
    request instead of one per path."""
    return profiles.memo(("effective_links", confidence), now, dict)


def _pairs(pre_costs: list[PhaseCost], dec_costs: list[PhaseCost], prompt_tokens: int,
           config: RouterConfig) -> list[tuple[PrefillSide, DecodeSide]]:
    """``paths.candidate_pairs`` as (prefill side, decode side) (``cost_model.prefill_side``):
    when no pair is pruned and the pool names are distinct, ``paths.every_pair`` of the sides
    themselves (no phase cost looked up per path)."""
    pre = [(s[0], s) for s in (prefill_side(c, prompt_tokens) for c in pre_costs)]
    dec = [(s[0], s) for s in (decode_side(c) for c in dec_costs)]
    if (not prunes(len(pre), len(dec), config) and len(dict(pre)) == len(pre) and len(dict(dec)) == len(dec)):
        return every_pair(pre, dec, config.allow_disaggregation)
    # What a path takes from each phase's cost, read once per pool rather than once per path.
    pre_parts = {id(c): side for c, (_, side) in zip(pre_costs, pre)}
    dec_parts = {id(c): side for c, (_, side) in zip(dec_costs, dec)}
    return [(pre_parts[id(p)], dec_parts[id(d)]) for p, d in candidate_pairs(pre_costs, dec_costs, config)]


def _candidates(
    request: RequestWork,
    pools: list[PoolState],
    profiles: ProfileTable,
    now: float,
    config: RouterConfig,
    skip: frozenset[str],
) -> tuple[list[PathEstimate], list[float], list[tuple[str, str]]]:
    """Every acceptable path for ``request`` with its ``total_s``, and why each dropped
    pool/phase or path was dropped. Each pool's side of a path is read once
    (``cost_model.prefill_side`` / ``decode_side``) and every path adds two of them up
    (``cost_model.path_estimate``, what ``combine`` does)."""
    pre_costs, rejected = phase_costs(request, pools, profiles, Phase.PREFILL, now, config, skip=skip)
    dec_costs, rejected_d = phase_costs(request, pools, profiles, Phase.DECODE, now, config, skip=skip)
    rejected += rejected_d
    paths: list[PathEstimate] = []
    totals: list[float] = []
    measured_quality = bool(profiles.quality)
    prompt_tokens, usd_per_gb, model = request.prompt_tokens, config.transfer_usd_per_gb, request.model
    links = _links(profiles, now, config.confidence)
    need = required_quality(request, config)
    for pre, dec in _pairs(pre_costs, dec_costs, prompt_tokens, config):
        src, dst, link = pre[0], dec[0], None
        if src != dst:
            mismatch = kv_handover(pre[1], dec[1])
            if mismatch is not None:
                rejected.append((f"{src}->{dst}", mismatch))
                continue
            link = links.get((src, dst))
            if link is None:
                link = links[(src, dst)] = effective_link(profiles, src, dst, now, config.confidence)
        estimate = path_estimate(pre, dec, link, usd_per_gb)
        measured = path_quality(profiles, model, src, dst, now) if measured_quality else None
        if measured is not None:
            estimate = estimate._replace(quality=measured.score)
        # path_filter's verdict; the common case (no canary measure, quality enough) inline
        reason = None if measured is None and estimate.quality >= need else path_filter(
            request, estimate, config, measured)
        if reason is None:
            paths.append(estimate)
            totals.append(estimate.total_s)
        else:
            rejected.append((f"{src}->{dst}", reason))
    return paths, totals, rejected


RankKey = tuple[int, float, float, str, str, int]


def _rank_keys(paths: list[PathEstimate], scores: list[float], totals: Sequence[float], model: str,
               state: RouterState, prefill_pools: set[str], decode_pools: set[str]) -> list[RankKey]:
    """One sort key per path (in ``paths`` order; the last element is the path's index): best
    score first; equal scores (in units of 1e-9, so float noise cannot herd; scores are in
    [0, 1]) go to the pool owed the most traffic share, then to the shorter estimate, then by
    name. ``prefill_pools``, ``decode_pools``: the pools the paths use for each phase. The
    router takes the least key (or the least of a subset) and sorts only when it must walk
    past the best."""
    credits_p, credits_d = state.credits(model, Phase.PREFILL), state.credits(model, Phase.DECODE)
    credit_p = {a: credits_p.get(a, 0.0) for a in prefill_pools}
    credit_d = {b: credits_d.get(b, 0.0) for b in decode_pools}
    return [  # e[0], e[1]: a path's prefill and decode pools
        (-int(score * 1e9 + 0.5), -(credit_p[e[0]] + credit_d[e[1]]), total, e[0], e[1], i)
        for i, (e, score, total) in enumerate(zip(paths, scores, totals))
    ]


def _walkable(paths: list[PathEstimate], best: int, config: RouterConfig) -> frozenset[int] | None:
    """The paths the picker may walk to from the best-scored one (``best``) to explore a pool or
    to keep a pool within its traffic share: those whose KV transfer costs at most the best
    path's own transfer plus ``walk_transfer_share`` of the best path's dollars. None (every path)
    when moving KV is free. Measuring a pool and spreading load are worth a little money, never a
    transfer that costs more than the work; only the scores may choose to pay for one."""
    price = config.transfer_usd_per_gb
    if price <= 0.0:
        return None
    chosen = paths[best]
    allowance = transfer_dollars(chosen.kv_bytes, price) + config.walk_transfer_share * (chosen.cost or 0.0)
    return frozenset(i for i, e in enumerate(paths) if transfer_dollars(e.kv_bytes, price) <= allowance + 1e-15)


def _pick(
    keys: list[RankKey], paths: list[PathEstimate], model: str, state: RouterState, config: RouterConfig,
    rng: random.Random, draw: float, pools_used: set[str],
) -> tuple[int, bool, int]:
    """(chosen path index, whether it was an exploration pick, how many better paths were passed
    over); ``keys``: ``_rank_keys`` of ``paths``; ``pools_used``: every pool some path uses. Walks
    away from the best path go only to ``_walkable`` paths."""
    best = min(keys)
    allowed = _walkable(paths, best[-1], config)
    if draw < config.exploration_share:
        explorable = sorted(pools_used)
        if len(explorable) > 1:
            target = explorable[rng.randrange(len(explorable))]
            through = [k for k in keys if (target == k[3] or target == k[4]) and (allowed is None or k[-1] in allowed)]
            if through:
                return min(through)[-1], True, 0
    over_p = state.over_budget(model, Phase.PREFILL, config)
    over_d = state.over_budget(model, Phase.DECODE, config)
    if best[3] not in over_p and best[4] not in over_d:
        return best[-1], False, 0
    for n, k in enumerate(sorted(keys)):
        if k[3] not in over_p and k[4] not in over_d and (allowed is None or k[-1] in allowed):
            return k[-1], False, n
    return best[-1], False, 0


def route(
    request: RequestWork,
    pools: Iterable[PoolState],
    profiles: ProfileTable,
    state: RouterState,
    config: RouterConfig,
    now: float,
    rng: random.Random,
) -> RoutingDecision | NoPlacement:
    """Place ``request``: prefill pool, decode pool (colocated when equal), estimate and scores."""
    pools = list(pools)
    draw = rng.random()
    paths, totals, rejected = _candidates(request, pools, profiles, now, config, frozenset())
    relaxed: frozenset[str] = frozenset()
    for name, wanted in (("room_now", config.relax_room_when_empty),
                         ("not_avoided", config.relax_avoid_when_empty and bool(request.avoid_pools))):
        if not paths and wanted:
            relaxed |= {name}
            paths, totals, rejected = _candidates(request, pools, profiles, now, config, relaxed)
    if not paths:
        reason = f"no eligible path for model {request.model!r} among {len(pools)} pool(s)"
        return NoPlacement(request.request_id, reason, tuple(rejected))
    x = ScoreInput(paths, FieldStats.of(paths, totals), request, now, config, totals)
    scores, columns = score_paths(x)
    prefill_pools, decode_pools = {e[0] for e in paths}, {e[1] for e in paths}
    keys = _rank_keys(paths, scores, x.totals, request.model, state, prefill_pools, decode_pools)
    chosen, explored, passed_over = _pick(keys, paths, request.model, state, config, rng, draw,
                                          prefill_pools | decode_pools)
    e = paths[chosen]
    rival = min((k for k in keys if (k[3] == k[4]) is not e.colocated), default=None)
    return RoutingDecision(
        request_id=request.request_id,
        prefill_pool=e.prefill_pool,
        decode_pool=e.decode_pool,
        colocated=e.colocated,
        estimated_completion=now + e.total_s,
        estimate=e,
        scores=parts_of(columns, chosen),
        score=scores[chosen],
        explored=explored,
        rejected=tuple(rejected),
        eligible_prefill=tuple(sorted(prefill_pools)),
        eligible_decode=tuple(sorted(decode_pools)),
        rival=None if rival is None else paths[rival[-1]],
        rival_score=0.0 if rival is None else scores[rival[-1]],
        passed_over=0 if explored else passed_over,
    )
