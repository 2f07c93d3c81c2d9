"""Closed loop, pure: route -> fake fleet -> telemetry aggregates -> build_profile_rows -> refresh.

The "fleet" is a few functions: each pool has a true throughput (which the test changes
mid-run), every placed request yields one telemetry observation per phase, and the aggregates
are exponentially-decayed means per pool and phase like the ClickHouse query computes. It tests
the policy's feedback loop, not hardware.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from phaseroute.streams.policy import (
    Phase,
    PhaseAggregate,
    ProfileSource,
    ProfileTable,
    RouterConfig,
    RouterState,
    build_profile_rows,
    route,
)

TAU_S = 60.0  # decay of the fake telemetry query
INTERVAL_S = 30.0  # one profile refresh per interval
PER_INTERVAL = 200  # requests routed per interval


@dataclass
class FakeFleet:
    """True behaviour of each pool and the telemetry it has produced."""

    speed: dict[str, float]  # true decode tokens/s at batch 32 (prefill is 10x)
    error_rate: dict[str, float] = field(default_factory=dict)
    observations: list[tuple[float, str, Phase, int, int]] = field(default_factory=list)  # (t, pool, phase, n, errors)
    tput_seen: dict[tuple[str, Phase], list[tuple[float, float, int]]] = field(default_factory=dict)

    def run(self, placed: Counter, now: float) -> None:
        """Execute what was placed this interval: one sample per request per phase."""
        for (pool, phase), n in placed.items():
            errors = round(n * self.error_rate.get(pool, 0.0))
            tps = self.speed[pool] * (10 if phase is Phase.PREFILL else 1)
            self.observations.append((now, pool, phase, n, errors))
            if n > errors:
                self.tput_seen.setdefault((pool, phase), []).append((now, tps, n - errors))

    def aggregates(self, model: str, now: float) -> list[PhaseAggregate]:
        """``sum(v * exp(-age/tau)) / sum(exp(-age/tau))`` per pool and phase, three batch buckets."""
        out = []
        keys = {(pool, phase) for _, pool, phase, _, _ in self.observations}
        for pool, phase in sorted(keys, key=lambda k: (k[0], k[1].value)):
            obs = [o for o in self.observations if (o[1], o[2]) == (pool, phase)]
            samples, errors = sum(o[3] for o in obs), sum(o[4] for o in obs)
            seen = self.tput_seen.get((pool, phase), [])
            weights = [n * math.exp(-(now - t) / TAU_S) for t, _, n in seen]
            tps = sum(w * v for w, (_, v, _) in zip(weights, seen, strict=True)) / sum(weights) if seen else 0.0
            for batch, fraction in ((1, 1 / 8), (8, 1 / 2), (32, 1.0)):
                out.append(
                    PhaseAggregate(
                        model,
                        phase,
                        pool,
                        "fp32",
                        batch,
                        samples,
                        tps * fraction,
                        0.01,
                        0.02,
                        0.04,
                        errors,
                        2000.0,
                        1000.0,
                        max(o[0] for o in obs),
                    )
                )
        return out


def run_loop(mk, fleet: FakeFleet, pools, intervals: int, on_interval, config: RouterConfig, seed: int = 7):
    """Route, execute, rebuild profiles, refresh; returns per-interval Counter of decode pools."""
    priors = [r for name in fleet.speed for r in mk.both(name, 1000.0, source=ProfileSource.PROFILER, updated_at=0.0)]
    table = ProfileTable.from_rows(priors)
    state, rng, history = RouterState(), random.Random(seed), []
    state.refresh(pools, table, config, mk.NOW)
    for k in range(intervals):
        now = mk.NOW + k * INTERVAL_S
        on_interval(k, fleet)
        pools = [mk.pool(p.name, heartbeat=now) for p in pools]
        placed, decode_pools = Counter(), Counter()
        for i in range(PER_INTERVAL):
            request = mk.req(f"r{k}-{i}")
            d = route(request, pools, table, state, config, now, rng)
            state.record(d, request, now, config)
            placed[(d.prefill_pool, Phase.PREFILL)] += 1
            placed[(d.decode_pool, Phase.DECODE)] += 1
            decode_pools[d.decode_pool] += 1
        history.append(decode_pools)
        fleet.run(placed, now)
        table = table.with_rows(build_profile_rows(fleet.aggregates(mk.MODEL, now), now))
        state.refresh(pools, table, config, now)
    return history, state


def test_a_pool_slowed_4x_loses_traffic_steadily_without_oscillating(mk):
    config = RouterConfig(exploration_share=0.05, max_share_step=0.1)
    fleet = FakeFleet(speed={"a": 1000.0, "b": 1000.0})
    slow_at = 6

    def slow_b(k: int, f: FakeFleet) -> None:
        if k == slow_at:
            f.speed["b"] = 250.0

    history, state = run_loop(mk, fleet, [mk.pool("a"), mk.pool("b")], 20, slow_b, config)
    share_b = [h["b"] / PER_INTERVAL for h in history]
    before, after = share_b[2:slow_at], share_b[slow_at + 1 :]  # after[0]: first interval routed on the slow telemetry
    assert all(0.45 <= s <= 0.55 for s in before), before  # even split while both are equal
    # The target may move 0.1 per refresh, so 0.5 -> 0.3 takes at least two; allow four.
    assert max(after[3:]) <= 0.3, after
    assert min(after) >= 0.15, after  # the slow pool is not starved: it keeps its capacity share (1/5)
    # Monotone-ish: no interval gains more than exploration noise over the previous one, in total little.
    rises = [max(0.0, b - a) for a, b in itertools.pairwise(after)]
    assert max(rises) <= 0.04 and sum(rises) <= 0.06, after
    assert state.targets(mk.MODEL, Phase.DECODE)["b"] == pytest.approx(0.2, abs=0.02)


def test_a_pool_that_fails_everything_gets_no_work_once_measured(mk):
    config = RouterConfig(exploration_share=0.1)
    fleet = FakeFleet(speed={"good": 1000.0, "bad": 1000.0}, error_rate={"bad": 1.0})
    history, _ = run_loop(mk, fleet, [mk.pool("good"), mk.pool("bad")], 6, lambda k, f: None, config)
    assert history[0]["bad"] > 0  # before any telemetry the prior made it look fine
    assert all(h["bad"] == 0 for h in history[1:]), history
