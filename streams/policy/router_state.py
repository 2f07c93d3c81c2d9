"""Anti-herding: smoothed target traffic shares per (model, phase) and deficit counters that enforce them.

The caller keeps one :class:`RouterState` next to the profile table and
- calls :meth:`RouterState.refresh` whenever the profile table changes: each pool's desired
  share is proportional to its useful capacity (workers x measured throughput at full batch x
  (1 - error rate)) ** ``share_sharpness``; the target moves toward it by a convex step whose
  largest per-pool move is at most ``max_share_step``. A new pool therefore ramps up, and a
  pool that looked best a minute ago cannot take all traffic in one refresh (nor lose it);
- calls :meth:`RouterState.record` after acting on each routing decision. Every pool eligible
  for that request earns credit = tokens x its target share (renormalised over the eligible
  pools) and the chosen pool pays the tokens, as in deficit / smooth weighted round robin.
``route`` reads the state (never writes it): it passes over a path whose pool's credit is
below ``-share_slack`` x the recent tokens of that (model, phase) while a path within budget
exists, and breaks score ties in favour of the pool owed the most. Because the credit counts
what each pick owed *at the targets of its time*, a target change acts on the next picks at
once: no overshoot, no oscillation. Credits and the realized token counts decay with
``share_half_life_s`` (together, so credits still sum to zero), so a pool's old debt or hoard
fades; in steady state the best-scored pool runs about ``share_slack`` above its target.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from .confidence import effective_profile
from .cost_model import pool_tokens_per_s
from .router_config import RouterConfig
from .types import Phase, PoolState, ProfileTable, RequestWork, RoutingDecision

ShareKey = tuple[str, Phase]  # (model, phase)
_NO_CREDIT: Mapping[str, float] = {}


@dataclass(frozen=True)
class ShareUpdate:
    """What one refresh did to one (model, phase): shares before, desired, after."""

    model: str
    phase: Phase
    before: Mapping[str, float]
    desired: Mapping[str, float]
    after: Mapping[str, float]

    @property
    def largest_move(self) -> float:
        names = set(self.before) | set(self.after)
        return max((abs(self.after.get(n, 0.0) - self.before.get(n, 0.0)) for n in names), default=0.0)


def _desired(
    model: str, phase: Phase, pools: Iterable[PoolState], profiles: ProfileTable, config: RouterConfig, now: float
) -> dict[str, float]:
    weights: dict[str, float] = {}
    for pool in pools:
        fresh = pool.alive and now - pool.last_heartbeat <= config.heartbeat_timeout_s
        if not (fresh and pool.serves(phase) and model in pool.models):
            continue
        eff = effective_profile(profiles, model, phase, pool.name, pool.variant, now, config.confidence)
        if eff is None or eff.row.error_rate >= config.max_error_rate:
            continue
        weights[pool.name] = pool_tokens_per_s(pool, eff.row) ** config.share_sharpness
    total = sum(weights.values())
    if total <= 0:
        return {name: 1.0 / len(weights) for name in weights} if weights else {}
    return {name: w / total for name, w in weights.items()}


def _bounded_step(current: Mapping[str, float], desired: Mapping[str, float], max_step: float) -> dict[str, float]:
    names = sorted(set(current) | set(desired))
    gap = {n: desired.get(n, 0.0) - current.get(n, 0.0) for n in names}
    largest = max((abs(g) for g in gap.values()), default=0.0)
    alpha = 1.0 if largest <= max_step else max_step / largest
    moved = {n: current.get(n, 0.0) + alpha * gap[n] for n in names}
    return {n: s for n, s in moved.items() if s > 1e-12}


class RouterState:
    """Target shares, deficit credits and realized shares per (model, phase); see the module docstring."""

    def __init__(self) -> None:
        self._targets: dict[ShareKey, dict[str, float]] = {}
        self._credit: dict[ShareKey, dict[str, float]] = {}
        self._routed: dict[ShareKey, dict[str, float]] = {}
        self._routed_at: dict[ShareKey, float] = {}
        # ``_normalised`` by (key, eligible pools): it depends only on the targets, which change in ``refresh``
        self._shares: dict[tuple[ShareKey, tuple[str, ...]], dict[str, float]] = {}
        self.refreshes = 0

    def refresh(
        self, pools: Iterable[PoolState], profiles: ProfileTable, config: RouterConfig, now: float
    ) -> list[ShareUpdate]:
        """Move every (model, phase) target toward the capacity split of the new profiles."""
        pools = list(pools)
        self._shares.clear()
        keys = {(m, ph) for p in pools for m in p.models for ph in p.phases} | set(self._targets)
        updates = []
        for model, phase in sorted(keys, key=lambda k: (k[0], k[1].value)):
            desired = _desired(model, phase, pools, profiles, config, now)
            before = self._targets.get((model, phase))
            if before is None:
                if not desired:
                    continue
                before = {name: 1.0 / len(desired) for name in desired}  # no history: an even split
            after = _bounded_step(before, desired, config.max_share_step) if desired else dict(before)
            self._targets[(model, phase)] = after
            updates.append(ShareUpdate(model, phase, dict(before), desired, dict(after)))
        self.refreshes += 1
        return updates

    def record(self, decision: RoutingDecision, request: RequestWork, now: float, config: RouterConfig) -> None:
        """Count a placement that was acted on (prompt tokens to prefill, output tokens to decode)."""
        for phase, pool, tokens, among in (
            (Phase.PREFILL, decision.prefill_pool, request.prompt_tokens, decision.eligible_prefill),
            (Phase.DECODE, decision.decode_pool, request.max_output_tokens, decision.eligible_decode),
        ):
            key = (request.model, phase)
            self._decay(key, now, config)
            self._charge(key, pool, tokens, among)
            counts = self._routed.setdefault(key, {})
            counts[pool] = counts.get(pool, 0.0) + tokens

    def _decay(self, key: ShareKey, now: float, config: RouterConfig) -> None:
        last = self._routed_at.get(key, now)
        if now > last:
            factor = 0.5 ** ((now - last) / config.share_half_life_s)
            for table in (self._routed.get(key, {}), self._credit.get(key, {})):
                for name in table:
                    table[name] *= factor
        self._routed_at[key] = max(now, last)

    def _charge(self, key: ShareKey, pool: str, tokens: float, among: Collection[str]) -> None:
        if isinstance(among, tuple):
            shares = self._shares.get((key, among))
            if shares is None:
                if len(self._shares) >= 4096:  # many distinct eligible sets: keep the cache small
                    self._shares.clear()
                shares = self._shares[(key, among)] = self._normalised(key, among)
        else:
            shares = self._normalised(key, among)
        credit = self._credit.setdefault(key, {})
        for name, share in shares.items():
            credit[name] = credit.get(name, 0.0) + tokens * share - (tokens if name == pool else 0.0)

    def _normalised(self, key: ShareKey, among: Collection[str]) -> dict[str, float]:
        targets = self._targets.get(key)
        if not targets or len(among) < 2:
            return {}
        total = sum(targets.get(n, 0.0) for n in among)
        return {n: targets.get(n, 0.0) / total for n in among} if total > 0 else {}

    def targets(self, model: str, phase: Phase) -> dict[str, float]:
        return dict(self._targets.get((model, phase), {}))

    def credit(self, model: str, phase: Phase, pool: str) -> float:
        """Tokens the pool is owed (> 0) or has taken beyond its target share (< 0)."""
        return self._credit.get((model, phase), {}).get(pool, 0.0)

    def credits(self, model: str, phase: Phase) -> Mapping[str, float]:
        """Every pool's ``credit`` of (model, phase) (a pool not in it has 0); read-only."""
        return self._credit.get((model, phase), _NO_CREDIT)

    def realized(self, model: str, phase: Phase) -> dict[str, float]:
        """Decayed share of routed tokens per pool (decay is common to all pools of a key, so
        the shares do not depend on when they are read)."""
        counts = self._routed.get((model, phase), {})
        total = sum(counts.values())
        return {name: c / total for name, c in counts.items()} if total > 0 else {}

    def over_budget(self, model: str, phase: Phase, config: RouterConfig) -> frozenset[str]:
        """The pools of (model, phase) that have taken more than ``share_slack`` of the recent
        tokens beyond their target share (the picker passes them over)."""
        allowance = config.share_slack * sum(self._routed.get((model, phase), {}).values())
        credits = self._credit.get((model, phase), {})
        return frozenset(pool for pool, credit in credits.items() if credit < -allowance - 1e-6)

    def snapshot(self) -> dict[str, dict[str, dict[str, float]]]:
        """Targets, credits and realized shares by ``"model/phase"``, for reporting."""
        return {
            f"{m}/{ph.slug}": {
                "target": dict(t),
                "credit": dict(self._credit.get((m, ph), {})),
                "realized": self.realized(m, ph),
            }
            for (m, ph), t in sorted(self._targets.items(), key=lambda kv: (kv[0][0], kv[0][1].value))
        }
