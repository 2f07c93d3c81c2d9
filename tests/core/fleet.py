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
    JobAdmitted,
    JobRecord,
    JobSubmitted,
    OutputWritten,
    ProfilesUpdated,
    PromptSize,
    QueueRequest,
    ResultReceived,
)
from phaseroute.streams.core.one_process import OneProcessControl
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


class Sink:
    """The result sink: the first result per request is a line; receipts carry the tallies."""

    def __init__(self) -> None:
        self.lines: dict[str, dict[str, ResultReceived]] = {}  # job id -> request id -> its line

    def write(self, r: ResultReceived) -> None:
        self.lines.setdefault(r.job_id, {}).setdefault(r.request_id, r)

    def receipt(self, job_id: str) -> OutputWritten:
        lines = list(self.lines.get(job_id, {}).values())
        ok = [r for r in lines if r.ok]
        return OutputWritten(job_id, len(lines), len(ok), len(lines) - len(ok), sum(r.prompt_tokens for r in ok),
                             sum(r.completion_tokens for r in ok))


def control_of(c: ControlCore | OneProcessControl, job_id: str, now: float) -> OneProcessControl:
    """``c`` with a job tracker beside it; for a bare core, one that took the verdict the core's
    backlog holds (as a live tracker does from ``jobs.admissions``)."""
    if isinstance(c, OneProcessControl):
        return c
    control = OneProcessControl(c)
    if job_id in c.jobs.jobs:
        control.tracker.handle(JobAdmitted(JobRecord.from_record(c.jobs.jobs[job_id].to_record()), now), now)
    return control


def run_to_completion(c: ControlCore | OneProcessControl, job_id: str, now: float, steps: int = 200,
                      pending: list | None = None) -> float:
    """Tick, and answer every dispatch with a result and the sink's receipt, until the job's
    tracker says it is final (``pending``: decisions already made, answered first)."""
    control = control_of(c, job_id, now)
    core, sink = control.core, Sink()
    results: list[ResultReceived] = [ResultReceived(d.work.request_id, d.work.job_id, False, d.work.prompt_tokens, 0)
                                     for d in pending or () if isinstance(d, FailRequest)]
    for _ in range(steps):
        now += 0.25
        core.handle(FleetObserved(tuple(pool(n, now) for n in sorted(core.dispatch.fleet._observed))), now)
        for d in control.tick(now):
            if isinstance(d, Dispatch):
                results.append(ResultReceived(d.work.request_id, d.work.job_id, True, d.work.prompt_tokens, 8))
            elif isinstance(d, FailRequest):
                results.append(ResultReceived(d.work.request_id, d.work.job_id, False, d.work.prompt_tokens, 0))
        for r in results:  # the sink writes each first result, the core reads them
            sink.write(r)
            control.handle(r, now)
        results.clear()
        control.handle(sink.receipt(job_id), now)
        record = control.tracker.jobs[job_id]
        if record.state.is_finished:
            return now
    raise AssertionError(f"job {job_id} is still {control.tracker.jobs[job_id].state.name}")
