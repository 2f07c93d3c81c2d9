"""How long a path that turned lossy goes unnoticed, against the canary share.

The live pieces on a virtual clock: the control core (``streams.core.ControlCore``, the object
the Faust control plane runs) and the drift monitor (``consumers.drift_monitor.DriftMonitor``,
the object the monitor service runs). Only the hardware is a fake, and named as one:

- ``FakePool``: one colocated pool of ``rows`` batch rows serving ``units_per_s`` work units
  (the fair scheduler's cost: a prompt token 1, an output token 2) shared evenly by its rows;
  its profile rows say the same, so admission and the router see the truth;
- ``FakeLoss``: what a canary run returns. While the path is sound, the canary set's own
  reference (its greedy tokens, its top-K log-probs); from ``lossy_at_s`` on, the decode is
  lossy as flipped KV bits make it: from position 1 the pool prefers the reference's second
  choice (the top two log-probs swapped), so greedy runs diverge and the KL is far above the
  EXACT tier's threshold.

Life of one run: a flooding tenant's job keeps the pool saturated from t=0 (the case where the
share binds: with idle capacity canaries run at once); the monitor starts a round on the path
when it is due (at once, then every ``interval_s``, the wait doubling up to ``max_interval_s``
while the path stays HEALTHY); each canary enters the core as a request of the reserved tenant
(the ``requests.pending`` hop), the fair scheduler releases it within ``CoreConfig.canary_share``
and the router places it on its pinned path; the pool's result goes to the core and, for a
canary, to the monitor. The detection time is from ``lossy_at_s`` to the monitor's first
DEMOTED alert on the path; it is the wait for the next round plus that round's time at the
share. ``detection_table`` runs it for each share and for lossy moments spread over one
longest interval (the wait depends on where in the interval the path turns).
"""

from __future__ import annotations

import enum
import heapq
import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from phaseroute.consumers.drift_monitor import REQUESTS_TOPIC, DriftMonitor, MonitorConfig
from phaseroute.engine.canaries import Canary, CanarySet, load_canaries
from phaseroute.schemas.enums import CanaryMode, Phase, QualityAlertKind, QualityTier, ResultStatus
from phaseroute.schemas.ids import CANARY_TENANT
from phaseroute.schemas.ops_records import DriftMeasurement, QualityAlert
from phaseroute.schemas.records import JobCommand
from phaseroute.streams import policy as P
from phaseroute.streams.core import (
    ControlCore,
    CoreConfig,
    Dispatch,
    FailRequest,
    FleetObserved,
    JobSubmitted,
    ProfilesUpdated,
    PromptSize,
    QueueRequest,
    ResultReceived,
)
from phaseroute.streams.edge import cancel, request_queued

MODEL = "smollm2-135m"  # the model with a bundled canary set
POOL = "colo"
FLOOD = "flood"
CONTEXT = 2048


class _Due(enum.Enum):
    """What an entry of the run's event queue is due for."""

    TICK = enum.auto()  # the control core's tick
    BEAT = enum.auto()  # the pool's heartbeat and the monitor's tick
    DONE = enum.auto()  # a dispatched request's service time ended


@dataclass(frozen=True)
class FakePool:
    """A fake colocated pool (see the module docstring). The default is this machine's engine
    on the pipeline bench: 10,080 prompt and 1,187 output tokens in about 60 s, ~200 units/s."""

    rows: int = 32
    units_per_s: float = 200.0

    def service_s(self, prompt_tokens: int, output_tokens: int) -> float:
        return (prompt_tokens + 2 * output_tokens) * self.rows / self.units_per_s

    def aggregates(self) -> list[P.PhaseAggregate]:
        """Its profile: prefill at ``units_per_s`` prompt tokens/s, decode at half of it with every row busy."""
        out = []
        step = 2 * self.rows / self.units_per_s  # one token per row per step
        for b in sorted({1, max(1, self.rows // 4), self.rows}):
            out.append(P.PhaseAggregate(MODEL, Phase.DECODE, POOL, "fp32", b, 100, b / step, step, step, step, 0,
                                        46_080.0, 46_080.0, 0.0))
        for b in (1, 4, 8):
            seconds = b * 512 / self.units_per_s
            out.append(P.PhaseAggregate(MODEL, Phase.PREFILL, POOL, "fp32", b, 100, self.units_per_s, seconds,
                                        seconds, seconds, 0, 46_080.0, 46_080.0, 0.0))
        return out


@dataclass(frozen=True)
class FakeLoss:
    """Canary outputs of a path that turns lossy at ``lossy_at_s`` (see the module docstring)."""

    lossy_at_s: float

    def result(self, rid: str, canary: Canary, mode: str, width: int, now: float) -> dict[str, Any]:
        lossy = now >= self.lossy_at_s
        tokens, probes = list(canary.tokens), [list(row) for row in canary.top_logprobs]
        if lossy:
            for pos in range(1, len(tokens)):
                tokens[pos] = canary.top_ids[pos][1]
                probes[pos][0], probes[pos][1] = probes[pos][1], probes[pos][0]
        trace = {"argmax_ids": tokens, "probe_logprobs": [lp for row in probes for lp in row[:width]]}
        return {"request_id": rid, "status": ResultStatus.OK.value, "canary": {"mode": mode},
                "output_token_ids": tokens, "canary_trace": trace if mode == CanaryMode.FORCED else None}


@dataclass
class RunResult:
    share: float
    lossy_at_s: float
    detected_after_s: float | None  # None: not within the run
    rounds: int
    canary_units: float
    all_units: float
    round_s: list[float]  # start to measurement, per closed round

    @property
    def canary_unit_share(self) -> float:
        return self.canary_units / self.all_units if self.all_units else 0.0


@dataclass
class _Run:
    share: float
    pool: FakePool
    loss: FakeLoss
    monitor_config: MonitorConfig
    canaries: CanarySet
    until_s: float
    core: ControlCore = field(init=False)
    monitor: DriftMonitor = field(init=False)

    def __post_init__(self) -> None:
        config = CoreConfig(models={MODEL: P.ModelSpec(MODEL, CONTEXT)}, canary_share=self.share,
                            fair=P.FairConfig(tenant_weights={FLOOD: 1.0}, default_max_in_flight=4 * self.pool.rows))
        self.core = ControlCore(config, seed=1)
        self.monitor = DriftMonitor(self.monitor_config, self._monitor_sent, {MODEL: self.canaries})
        self.events: list[tuple[float, int, _Due, Any]] = []
        self.seq = itertools.count()
        self.running: dict[str, tuple[int, int]] = {}  # request id -> (prompt, output) tokens
        self.canary_of: dict[str, tuple[Canary, str]] = {}
        self.by_id = {c.canary_id: c for c in self.canaries.canaries}
        self.detected_at: float | None = None
        self.closed_at: dict[int, float] = {}  # round number -> when it was measured
        self.canary_units = self.all_units = 0.0

    # -- the hops --------------------------------------------------------------------------------
    def _monitor_sent(self, topic: str, key: str, kind: str, record: dict[str, Any]) -> None:
        if topic == REQUESTS_TOPIC:
            canary_id, mode = str(record["custom_id"]).rsplit("/", 1)
            self.canary_of[record["request_id"]] = (self.by_id[canary_id], mode)
            self._feed(self.core.handle(request_queued(record), self.now), self.now)
        elif kind == JobCommand.KIND:  # a closed round's late canaries are withdrawn
            command = cancel(record)
            if command is not None:
                self._feed(self.core.handle(command, self.now), self.now)
        elif kind == DriftMeasurement.KIND:
            self.closed_at[int(record["round"])] = self.now
        elif kind == QualityAlert.KIND and record["kind"] == QualityAlertKind.DEMOTED.name and self.detected_at is None:
            self.detected_at = self.now

    def _feed(self, decisions: Sequence[Any], now: float) -> None:
        for d in decisions:
            if isinstance(d, QueueRequest):
                self._feed(self.core.handle(d.request, now), now)
            elif isinstance(d, FailRequest):  # the failed result the shell would send, read back
                self.canary_of.pop(d.work.request_id, None)
                self._feed(self.core.handle(ResultReceived(d.work.request_id, d.work.job_id, False, d.work.prompt_tokens, 0), now), now)
            elif isinstance(d, Dispatch) and d.work.request_id not in self.running:  # a copy of a running one: skip
                prompt, output = d.work.prompt_tokens, d.work.max_output_tokens
                if d.work.request_id in self.canary_of:
                    output = len(self.canary_of[d.work.request_id][0].tokens)
                self.running[d.work.request_id] = (prompt, output)
                heapq.heappush(self.events, (now + self.pool.service_s(prompt, output), next(self.seq), _Due.DONE, d.work))

    def _pool_state(self, now: float) -> P.PoolState:
        return P.PoolState(name=POOL, alive=True, phases=frozenset({Phase.PREFILL, Phase.DECODE}),
                           models=frozenset({MODEL}), variant="fp32", workers=1, max_batch=self.pool.rows,
                           free_kv_bytes=4e9, queue_requests=0, queue_tokens=0, last_heartbeat=now)

    def _done(self, work: Any, now: float) -> None:
        prompt, output = self.running.pop(work.request_id)
        units = prompt + 2 * output
        self.all_units += units
        self._feed(self.core.handle(ResultReceived(work.request_id, work.job_id, True, prompt, output), now), now)
        if work.request_id in self.canary_of:
            self.canary_units += units
            canary, mode = self.canary_of.pop(work.request_id)
            self.monitor.on_result(self.loss.result(work.request_id, canary, mode, self.canaries.top_k, now))

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> RunResult:
        self.now = 0.0
        rows = P.build_profile_rows(self.pool.aggregates(), 0.0)
        table = P.ProfileTable.from_rows([replace(r, source=P.ProfileSource.PROFILER) for r in rows])
        self.core.handle(FleetObserved((self._pool_state(0.0),)), 0.0)
        self.core.handle(ProfilesUpdated(table), 0.0)
        flood = int(1.2 * self.until_s * self.pool.units_per_s / (256 + 2 * 32)) + self.pool.rows
        prompts = tuple(PromptSize(str(i), 128 + (i * 37) % 256, 32) for i in range(flood))
        self._feed(self.core.handle(JobSubmitted("flood-job", FLOOD, MODEL, 1, 0.0, 10 * self.until_s,
                                                 QualityTier.EXACT, 0.0, 0.0, prompts), 0.0), 0.0)
        tick = self.core.config.tick_s
        for due, period in ((_Due.TICK, tick), (_Due.BEAT, 1.0)):
            heapq.heappush(self.events, (0.0, next(self.seq), due, period))
        while self.events and self.detected_at is None:
            t, _, due, payload = heapq.heappop(self.events)
            if t > self.until_s:
                break
            self.now = t
            if due is _Due.DONE:
                self._done(payload, t)
                continue
            if due is _Due.TICK:
                self._feed(self.core.tick(t), t)
                while self.core.more_to_release:
                    self._feed(self.core.tick(t), t)
            else:  # the heartbeat and the monitor's own tick
                self.core.handle(FleetObserved((self._pool_state(t),)), t)
                self.monitor.tick([self._pool_state(t)], t)
            heapq.heappush(self.events, (t + payload, next(self.seq), due, payload))
        detected = None if self.detected_at is None else self.detected_at - self.loss.lossy_at_s
        durations = [self.closed_at[rnd.number] - rnd.started_at for rnd, _, _ in self.monitor.closed
                     if rnd.number in self.closed_at]
        return RunResult(self.share, self.loss.lossy_at_s, detected, self.monitor.rounds, self.canary_units,
                         self.all_units, durations)


def run_once(share: float, lossy_at_s: float, pool: FakePool | None = None, monitor: MonitorConfig | None = None,
             give_up_after_s: float = 3600.0, horizon_s: float | None = None) -> RunResult:
    """One run: the path turns lossy at ``lossy_at_s``; the run ends at detection, ``give_up_after_s``
    later, or at ``horizon_s``."""
    until = lossy_at_s + give_up_after_s if horizon_s is None else min(horizon_s, lossy_at_s + give_up_after_s)
    return _Run(share, pool or FakePool(), FakeLoss(lossy_at_s), monitor or MonitorConfig(), load_canaries(MODEL),
                until).run()


def detection_table(shares: Sequence[float] = (0.01, 0.03, 0.1, 0.3), pool: FakePool | None = None,
                    phases: int = 12, monitor: MonitorConfig | None = None) -> dict[str, Any]:
    """Per canary share: detection time (mean, median, worst) over ``phases`` lossy moments spread
    over one longest interval after the path reached it, and the canaries' share of the work served."""
    monitor = monitor or MonitorConfig()
    pool = pool or FakePool()
    # until the path's wait reached its longest: the doubling waits, and as long again for the rounds
    settle = 2 * sum(min(monitor.interval_s * 2**k, monitor.max_interval_s) for k in range(5))
    moments = [settle + monitor.max_interval_s * (k + 0.5) / phases for k in range(phases)]
    rows = []
    for share in shares:
        runs = [run_once(share, at, pool, monitor) for at in moments]
        found = [r.detected_after_s for r in runs if r.detected_after_s is not None]
        rows.append({
            "canary_share": share, "runs": len(runs), "detected": len(found),
            "detection_s_mean": round(statistics.fmean(found), 1) if found else None,
            "detection_s_median": round(statistics.median(found), 1) if found else None,
            "detection_s_max": round(max(found), 1) if found else None,
            "canary_work_share": round(statistics.fmean(r.canary_unit_share for r in runs), 4),
            "rounds_per_run": round(statistics.fmean(r.rounds for r in runs), 1),
            "round_s_mean": round(statistics.fmean(d for r in runs for d in r.round_s), 1),
            "round_s_max": round(max(d for r in runs for d in r.round_s), 1),
        })
    return {"pool": {"rows": pool.rows, "units_per_s": pool.units_per_s, "fake": True},
            "monitor": {"interval_s": monitor.interval_s, "max_interval_s": monitor.max_interval_s,
                        "round_timeout_s": monitor.round_timeout_s, "canaries": monitor.canaries},
            "lossy_at_s": [round(m, 1) for m in moments], "shares": rows, "flood_tenant": FLOOD,
            "canary_tenant": CANARY_TENANT}
