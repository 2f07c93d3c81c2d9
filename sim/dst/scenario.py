"""One seeded scenario of the deterministic simulation: tenants, jobs (good, infeasible and
malformed ones), the fake fleet, its profile table and the core's configuration. Everything is
drawn from the scenario's seed, so a seed is the whole test case."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from phaseroute.schemas.enums import Phase, QualityTier
from phaseroute.sim.dst.fleet import Faults, SimPool
from phaseroute.streams.core import CoreConfig, JobSubmitted, PromptSize
from phaseroute.streams.policy import (
    CurvePoint,
    FairConfig,
    ModelSpec,
    PathQuality,
    ProfileRow,
    ProfileSource,
    ProfileTable,
    RetryConfig,
)

MODEL = "dst-model"
BOTH = frozenset({Phase.PREFILL, Phase.DECODE})


@dataclass
class Scenario:
    seed: int
    jobs: int = 40
    requests_per_job: tuple[int, int] = (5, 200)
    tenants: int = 3
    pools: int = 4
    arrivals_s: float = 600.0          # jobs arrive over this window
    deadline_s: tuple[float, float] = (300.0, 1500.0)
    restart_per_s: float = 1 / 200     # control-plane restarts (each rebuilds the core from its store)
    duplicate: float = 0.05            # a message to the core is delivered twice
    delay_s: tuple[float, float] = (0.0, 0.4)  # delivery delay (reorders messages across topics)
    cancel: float = 0.08               # share of jobs their tenant cancels
    stranger_cancel: float = 0.05      # share of jobs another tenant tries to cancel (must change nothing)
    infeasible: float = 0.05           # share of jobs with a deadline no fleet could meet
    malformed: float = 0.05            # share of jobs with bad input (must be rejected with a reason)
    faults: Faults = field(default_factory=Faults)
    write_behind: bool = False         # the core writes its store every second only, as the live control plane


def core_config(s: Scenario, rng: random.Random) -> CoreConfig:
    weights = {f"t{k}": float(rng.choice((1, 1, 2, 3))) for k in range(s.tenants)}
    caps = {t: rng.choice((16, 32, 64)) for t in weights}
    return CoreConfig(
        models={MODEL: ModelSpec(MODEL, 8192)},
        fair=FairConfig(tenant_weights=weights, tenant_max_in_flight=caps, max_unit_requests=16),
        retry=RetryConfig(unplaced_give_up_s=120.0), expire_after_deadline_s=300.0,
    )


def fleet(s: Scenario, rng: random.Random) -> list[SimPool]:
    pools = []
    for k in range(s.pools):
        phases = BOTH if k < 2 else rng.choice((BOTH, frozenset({Phase.PREFILL}), frozenset({Phase.DECODE})))
        pools.append(SimPool(f"p{k}", phases, workers=rng.randint(1, 3), max_batch=rng.choice((4, 8, 16)),
                             prefill_tps=rng.uniform(2000, 8000), decode_tps=rng.uniform(40, 160),
                             variant=rng.choice(("fp32", "int8"))))
    return pools


def profile_table(pools: list[SimPool], now: float, rng: random.Random) -> ProfileTable:
    """What a profiler measured of each pool (one row per phase; some paths measured lossy)."""
    rows, quality = [], []
    for p in pools:
        for phase in p.phases:
            tps = p.prefill_tps if phase is Phase.PREFILL else p.decode_tps
            curve = (CurvePoint(1, tps), CurvePoint(p.max_batch, tps * p.max_batch))
            step = 1.0 / tps if phase is Phase.DECODE else 256 / tps
            rows.append(ProfileRow(MODEL, phase, p.name, p.variant, curve, step, step * 1.5, step * 2, 1000.0, 1000.0,
                                   0.0, 1.0, 500, now, ProfileSource.PROFILER))
    for a in pools:
        for b in pools:
            if Phase.PREFILL in a.phases and Phase.DECODE in b.phases and rng.random() < 0.3:
                ok = rng.random() < 0.6
                quality.append(PathQuality(MODEL, a.name, b.name, 1.0 if ok else 0.8, ok, 200, now))
    return ProfileTable.from_rows(rows, (), quality)


def jobs(s: Scenario, rng: random.Random) -> list[tuple[float, JobSubmitted, str]]:
    """(arrival time, job, what kind of job: good | infeasible | malformed), in arrival order."""
    out = []
    for j in range(s.jobs):
        at = rng.uniform(0.0, s.arrivals_s)
        n = rng.randint(*s.requests_per_job)
        prompts = tuple(PromptSize(f"c{i}", rng.randint(16, 2000), rng.randint(4, 160)) for i in range(n))
        tier = QualityTier.EXACT if rng.random() < 0.5 else QualityTier.APPROXIMATE
        deadline = at + rng.uniform(*s.deadline_s)
        kind, job_id, model, temperature, error = "good", f"job-{s.seed}-{j}", MODEL, 0.0, None
        draw = rng.random()
        if draw < s.infeasible:
            kind, deadline = "infeasible", at + 0.5
        elif draw < s.infeasible + s.malformed:
            kind = "malformed"
            bad = rng.randrange(5)
            if bad == 0:
                error = "line 3: not JSON (Expecting value at column 1)"
            elif bad == 1:
                model = "no-such-model"
            elif bad == 2:
                temperature = 0.8
            elif bad == 3:
                job_id = f"../../evil-{j}"
            else:
                prompts = prompts[:1] + prompts[:1]  # a custom id twice
        job = JobSubmitted(job_id, f"t{rng.randrange(s.tenants)}", model, rng.randint(0, 3), at, deadline, tier,
                           0.3 if tier is QualityTier.APPROXIMATE else 0.0, temperature, prompts, error)
        out.append((at, job, kind))
    return sorted(out, key=lambda x: x[0])
