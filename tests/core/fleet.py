"""A small fake fleet for the control core's unit tests (a fleet we do not have: two pools,
described by the states heartbeats would report and the rows a profiler would measure)."""

from __future__ import annotations

from phaseroute.schemas.enums import Phase, QualityTier
from phaseroute.streams.core import (
    ControlCore,
    CoreConfig,
    DictStore,
    Dispatch,
    FailRequest,
    FleetObserved,
    JobSubmitted,
    OutputWritten,
    ProfilesUpdated,
    PromptSize,
    QueueRequest,
    ResultReceived,
)
from phaseroute.streams.policy import CurvePoint, ModelSpec, PoolState, ProfileRow, ProfileSource, ProfileTable

MODEL = "m"
BOTH = frozenset({Phase.PREFILL, Phase.DECODE})


def pool(name: str, now: float, alive: bool = True) -> PoolState:
    return PoolState(name, alive, BOTH, frozenset({MODEL}), "fp32", 2, 8, 8e9, last_heartbeat=now,
                     worker_free_kv_bytes=4e9, worker_kv_capacity_bytes=4e9, kv_format="m|fp32")


def table(names: list[str], now: float) -> ProfileTable:
    rows = []
    for name in names:
        for phase, tps in ((Phase.PREFILL, 2000.0), (Phase.DECODE, 100.0)):
            rows.append(ProfileRow(MODEL, phase, name, "fp32", (CurvePoint(1, tps), CurvePoint(8, 8 * tps)), 0.01, 0.02,
                                   0.03, 1000.0, 1000.0, 0.0, 1.0, 500, now, ProfileSource.PROFILER))
    return ProfileTable.from_rows(rows)


def core(now: float, pools: tuple[str, ...] = ("a", "b"), **overrides: object) -> ControlCore:
    c = ControlCore(CoreConfig(models={MODEL: ModelSpec(MODEL, 4096)}, **overrides), DictStore(), seed=1)  # type: ignore[arg-type]
    c.handle(FleetObserved(tuple(pool(n, now) for n in pools)), now)
    c.handle(ProfilesUpdated(table(list(pools), now)), now)
    return c


def job(job_id: str, n: int, now: float, tenant: str = "acme", deadline_s: float = 3600.0) -> JobSubmitted:
    return JobSubmitted(job_id, tenant, MODEL, 1, now, now + deadline_s, QualityTier.EXACT, 0.0, 0.0,
                        tuple(PromptSize(f"c{i}", 50, 8) for i in range(n)))


def admit(c: ControlCore, ev: JobSubmitted, now: float) -> list:
    """Submit, and hand every admitted request back as requests.pending would; all the decisions."""
    out = c.handle(ev, now)
    for d in list(out):
        if isinstance(d, QueueRequest):
            out += c.handle(d.request, now)
    return out


def run_to_completion(c: ControlCore, job_id: str, now: float, steps: int = 200, pending: list | None = None) -> float:
    """Tick, and answer every dispatch with a result and the sink's receipt, until the job is final
    (``pending``: decisions already made, answered first)."""
    results: list[ResultReceived] = [ResultReceived(d.work.request_id, d.work.job_id, False, d.work.prompt_tokens, 0)
                                     for d in pending or () if isinstance(d, FailRequest)]
    lines: set[str] = set()
    for _ in range(steps):
        now += 0.25
        c.handle(FleetObserved(tuple(pool(n, now) for n in sorted(c.dispatch.fleet._observed))), now)
        for d in c.tick(now):
            if isinstance(d, Dispatch):
                results.append(ResultReceived(d.work.request_id, d.work.job_id, True, d.work.prompt_tokens, 8))
            elif isinstance(d, FailRequest):
                results.append(ResultReceived(d.work.request_id, d.work.job_id, False, d.work.prompt_tokens, 0))
        for r in results:  # the sink writes each first result, the core reads them
            lines.add(r.request_id)
            c.handle(r, now)
        results.clear()
        c.handle(OutputWritten(job_id, len(lines)), now)
        record = c.jobs.jobs[job_id]
        if record.state.is_finished:
            return now
    raise AssertionError(f"job {job_id} is still {c.jobs.jobs[job_id].state.name}")
