"""``phaseroute sim tick-bench``: what one control-core tick costs with many requests waiting.

A fake fleet (named one: pools described by heartbeats and profile rows, nothing runs) holds
a few hundred rows; ``queued`` requests of four tenants wait in the fair queues. Every tick a
share of the running requests finish (their results are fed in between ticks, not timed), so
each timed tick releases and routes about that many requests, plus its recovery steps. The same
run with 1,000 waiting requests (the same releases per tick) says whether a tick's cost depends
on the queue: it must not. The time spent inside the router is reported apart, since it grows
with the releases per tick, not with the queue. A period's releases beyond the core's
``max_releases_per_tick`` go in further ticks at the same instant (``more_to_release``), as the
live shell runs them: each is timed as a tick (it is what holds the event loop), and the
releases per period are reported too.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

from phaseroute.schemas.enums import Phase, QualityTier
from phaseroute.streams.core import (
    ControlCore,
    CoreConfig,
    Dispatch,
    FleetObserved,
    JobSubmitted,
    ProfilesUpdated,
    PromptSize,
    QueueRequest,
    ResultReceived,
)
from phaseroute.streams.policy import (
    CurvePoint,
    FairConfig,
    ModelSpec,
    PoolState,
    ProfileRow,
    ProfileSource,
    ProfileTable,
    TenantQuota,
)

MODEL = "bench-model"
BOTH = frozenset({Phase.PREFILL, Phase.DECODE})


def _fleet(now: float, pools: int) -> tuple[PoolState, ...]:
    return tuple(PoolState(f"p{k}", True, BOTH, frozenset({MODEL}), "fp16", 8, 16, 64e9, last_heartbeat=now,
                           worker_free_kv_bytes=8e9, worker_kv_capacity_bytes=8e9, kv_format="bench|fp16")
                 for k in range(pools))


def _table(pools: int, now: float) -> ProfileTable:
    rows = []
    for k in range(pools):
        for phase, tps in ((Phase.PREFILL, 10_000.0 * (1 + k)), (Phase.DECODE, 100.0 * (1 + k))):
            rows.append(ProfileRow(MODEL, phase, f"p{k}", "fp16", (CurvePoint(1, tps), CurvePoint(16, 16 * tps)),
                                   0.01, 0.02, 0.03, 1e5, 1e5, 0.0, 1.0, 1000, now, ProfileSource.PROFILER))
    return ProfileTable.from_rows(rows)


def run(queued: int, ticks: int = 1000, pools: int = 4, finish_share: float = 0.1, seed: int = 0,
        release_cap: int = CoreConfig.max_releases_per_tick) -> dict[str, Any]:
    rng = random.Random(seed)
    now = 1_000_000.0
    tenants = [f"t{k}" for k in range(4)]
    config = CoreConfig(models={MODEL: ModelSpec(MODEL, 32_768)},
                        fair=FairConfig(tenant_weights={t: 1.0 + k for k, t in enumerate(tenants)},
                                        default_max_in_flight=10**6),
                        quotas={t: TenantQuota(None, None) for t in tenants}, max_releases_per_tick=release_cap)
    core = ControlCore(config, seed=seed)
    core.handle(FleetObserved(_fleet(now, pools)), now)
    core.handle(ProfilesUpdated(_table(pools, now)), now)
    per_job, jobs = min(1000, queued), [0]

    def submit(n: int, at: float) -> None:
        """Jobs of ``n`` requests in all (the queue is kept at ``queued``: finished work is replaced)."""
        while n > 0:
            size = min(per_job, n)
            prompts = tuple(PromptSize(f"c{i}", rng.randint(50, 2000), rng.randint(10, 200)) for i in range(size))
            j = jobs[0] = jobs[0] + 1
            job = JobSubmitted(f"job-{j}", tenants[j % 4], MODEL, 1, at, at + 10**7, QualityTier.EXACT, 0.0, 0.0,
                               prompts)
            for d in core.handle(job, at):
                if isinstance(d, QueueRequest):
                    core.handle(d.request, at)
            n -= size

    t_admit = time.perf_counter()
    submit(queued, now)
    admit_s = time.perf_counter() - t_admit
    running: list[Dispatch] = []
    times, released, routing, per_period = [], [], [], []
    route, spent = core.dispatch.route, [0.0]

    def timed_route(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return route(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t

    core.dispatch.route = timed_route
    for k in range(ticks + 50):
        now += config.tick_s
        done = rng.sample(range(len(running)), int(len(running) * finish_share)) if running else []
        for i in sorted(done, reverse=True):
            d = running.pop(i)
            core.handle(ResultReceived(d.work.request_id, d.work.job_id, True, d.work.prompt_tokens,
                                       d.work.max_output_tokens), now)
        if k % 4 == 0:
            core.handle(FleetObserved(_fleet(now, pools)), now)
            waiting = sum(r.queued_requests for r in core.dispatch.fair.report())
            if waiting < queued:
                submit(queued - waiting, now)
        period_sent = 0
        while True:  # the slices of one period, as the live shell runs them (more_to_release)
            spent[0] = 0.0
            t0 = time.perf_counter()
            out = core.tick(now)
            elapsed = time.perf_counter() - t0
            sent = [d for d in out if isinstance(d, Dispatch)]
            running += sent
            period_sent += len(sent)
            if k >= 50:  # after the fleet filled up
                times.append(elapsed)
                routing.append(spent[0])
                released.append(len(sent))
            if not core.more_to_release:
                break
        if k >= 50:
            per_period.append(period_sent)
    waiting = sum(r.queued_requests for r in core.dispatch.fair.report())
    rest = sorted(t - r for t, r in zip(times, routing))
    times.sort()
    return {
        "queued_at_start": queued, "still_queued": waiting, "ticks": ticks, "admission_s": round(admit_s, 2),
        "tick_ms_p50": round(1000 * statistics.median(times), 3),
        "tick_ms_p99": round(1000 * times[int(0.99 * (len(times) - 1))], 3),
        "tick_ms_max": round(1000 * times[-1], 3),
        "outside_router_ms_p50": round(1000 * statistics.median(rest), 3),
        "outside_router_ms_p99": round(1000 * rest[int(0.99 * (len(rest) - 1))], 3),
        "router_us_per_dispatch": round(1e6 * sum(routing) / max(sum(released), 1), 1),
        "dispatches_per_tick": round(statistics.mean(released), 1), "release_cap": config.max_releases_per_tick,
        "ticks_per_period": round(len(times) / max(len(per_period), 1), 2),
        "dispatches_per_period": round(statistics.mean(per_period), 1), "running": len(running),
    }


def bench(queued: int = 100_000, ticks: int = 1000) -> dict[str, Any]:
    """The tick with ``queued`` waiting requests and with 1,000: the cost must not grow with the queue."""
    big, small = run(queued, ticks), run(1000, ticks)
    return {"queued": big, "thousand_queued": small,
            "p99_ratio": round(big["tick_ms_p99"] / max(small["tick_ms_p99"], 1e-9), 2)}
