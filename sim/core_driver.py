"""The phaseroute policy in the simulator: the live control core, driven by a simulated fleet.

``CoreDriver`` owns one ``ControlCore`` (the object the Faust control plane runs) and one
``JobTracker`` (what every control-plane instance runs for its partitions), joined in one
process (``OneProcessControl``), and does what the live shell, workers and result sink do
around them, with the simulated fleet in place of Kafka:
- a job arrival becomes ``JobSubmitted``; admitted requests come back as ``QueueRequest`` and go
  straight in as ``RequestQueued`` (the ``requests.pending`` hop);
- every ``tick_s`` (the control plane's timer) it reports the pools as heartbeats would
  (``FleetObserved``, every ``heartbeat_s``) and calls ``tick``; each ``Dispatch`` is placed on
  the simulated pools (``Simulator.place``; a speculative one on a twin row), each
  ``FailRequest`` comes back as a failed ``ResultReceived`` (the ``results`` hop);
- the simulated workers answer as real ones: ``KvReady`` when a disaggregated prefill finishes,
  ``ResultReceived`` when decode finishes (and the sink's ``OutputWritten`` receipt, with the
  job's output tallies, for each request's first result),
  ``AttemptFailed`` when an instance dies under an attempt or refuses it; a lost pool
  says nothing (its heartbeats say it is gone, and the core re-places its work itself);
- every profile refresh, the telemetry aggregates become profile rows through the policy's
  ``build_profile_rows`` (as the live profile builder does from ClickHouse): ``ProfilesUpdated``.
It holds no decision of its own: admission, fairness, routing, retries, stragglers and pool
loss are the core's. ``profiles="datasheet"`` is the static-spec router: the same core on
DATASHEET rows only, never refreshed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from phaseroute.schemas.enums import JobEventKind, Phase, QualityTier
from phaseroute.sim.catalogue import load_catalogue
from phaseroute.sim.events import DEFERRED, DONE, GAVE_UP, LOST, NEW, TICK, TRANSFER
from phaseroute.sim.perfmodel import InstancePerf
from phaseroute.sim.telemetry import DECODE
from phaseroute.streams import policy as P
from phaseroute.streams.core import (
    AttemptFailed,
    ControlCore,
    CoreConfig,
    CoreStore,
    Dispatch,
    FailRequest,
    FleetObserved,
    JobChanged,
    JobSubmitted,
    JobTracker,
    KvReady,
    OutputWritten,
    Problem,
    ProfilesUpdated,
    PromptSize,
    QueueRequest,
    ResultReceived,
)
from phaseroute.streams.core.one_process import OneProcessControl

PROFILE_CONTEXT = 1024       # context of the start-up microbenchmark (decode)
PROFILE_PROMPT = 1024        # prompt length of the start-up microbenchmark (prefill)


@dataclass
class PhaserouteOptions:
    profiles: str = "measured"                   # "measured" | "datasheet" (static-spec router)
    router: P.RouterConfig = field(default_factory=P.RouterConfig)
    admission: P.AdmissionConfig = field(default_factory=P.AdmissionConfig)
    retry: P.RetryConfig = field(default_factory=P.RetryConfig)
    builder: P.ProfileBuilderConfig = field(default_factory=P.ProfileBuilderConfig)
    fair: dict[str, Any] = field(default_factory=dict)  # FairConfig overrides (tenant weights come from the workload)
    quota: P.TenantQuota = field(default_factory=lambda: P.TenantQuota(None, None))
    core: dict[str, Any] = field(default_factory=dict)  # CoreConfig overrides
    heartbeat_s: float = 1.0                     # pools report as of their last heartbeat
    per_worker_kv: bool = True                   # heartbeats carry each worker's free KV and capacity (False:
    #                                              only the pool's sum; ablation)
    store: CoreStore | None = None               # where the core persists (None: nowhere)


def _aggregates_from_perf(perf: InstancePerf, pool: str, model: str, variant: str, now: float,
                          samples: int) -> list[P.PhaseAggregate]:
    """Microbenchmark of one instance: decode at several batches, prefill at several prompt counts."""
    out = []
    batches = [b for b in (1, 4, 16, 64, 256) if b <= perf.max_batch
               and b * (PROFILE_CONTEXT + 1) * perf.kv_per_token <= perf.kv_capacity] or [1]
    for b in batches:
        step = perf.step_time(b, b * PROFILE_CONTEXT)
        out.append(P.PhaseAggregate(model, Phase.DECODE, pool, variant, b, samples, b / step, step, step, step, 0,
                                    perf.kv_per_token, perf.kv_per_token, now))
    for k in (1, 2, 4, 8):
        tokens = k * PROFILE_PROMPT
        step = perf.step_time(0, 0, tokens, PROFILE_PROMPT)
        out.append(P.PhaseAggregate(model, Phase.PREFILL, pool, variant, k, samples, tokens / step, step, step, step,
                                    0, perf.kv_per_token, perf.kv_per_token, now))
    return out


class CoreDriver:
    self_released = True  # the engine asks no release or route of this driver: the core ticks

    def __init__(self, options: PhaserouteOptions | None = None, name: str | None = None):
        self.opt = options or PhaserouteOptions()
        self.name = name or ("static-spec" if self.opt.profiles == "datasheet" else "phaseroute")
        self.problems: list[Problem] = []

    # ------------------------------------------------------------------ set-up
    def attach(self, sim: Any) -> None:
        self.sim = sim
        w = sim.w
        self.names = [p.spec.name for p in sim.pools]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.phases = [frozenset(p.spec.phases) for p in sim.pools]
        cat = load_catalogue()
        models = {m: P.ModelSpec(m, cat.models[m].context_tokens if m in cat.models else 131072)
                  for m in {t.model for t in w.tenants}}
        # tenants' in-flight caps never bind below what the whole fleet can hold (the workload's
        # weights decide the shares)
        cap = max(512, sum(p.spec.instances * p.spec.perf.max_batch for p in sim.pools))
        fair = P.FairConfig(**{"tenant_weights": {t.name: t.weight for t in w.tenants}, "default_max_in_flight": cap,
                               **self.opt.fair})
        config = CoreConfig(models=models, router=self.opt.router, fair=fair, retry=self.opt.retry,
                            admission=replace(self.opt.admission, default_quota=self.opt.quota), **self.opt.core)
        self.core = self.make_core(config, seed=sim.cfg.seed * 7919 + 1)
        self.control = OneProcessControl(self.core, JobTracker(config))
        self.outputs: dict[str, list[int]] = {}  # the sink: job id -> [lines, ok, failed, tokens in, tokens out]
        self.tick_s = config.tick_s
        self.rid: list[str] = [""] * w.n_requests  # row -> request id (twin rows appended)
        self.row_of: dict[str, int] = {}         # request id -> its original row
        self.row_attempt: dict[int, int] = {}    # row -> the core's attempt number running on it
        self.placed: set[int] = set()            # original rows placed at least once (tenant release metrics)
        self.hb_t = -math.inf
        self.ticking = False
        self.share_log: list[dict[str, Any]] = []
        rows = []
        for p in sim.pools:
            s = p.spec
            ds = P.build_profile_rows(_aggregates_from_perf(s.datasheet, s.name, s.model, s.variant, 0.0, 1), 0.0)
            rows += [replace(r, source=P.ProfileSource.DATASHEET) for r in ds]
            if self.opt.profiles == "measured":
                pr = P.build_profile_rows(_aggregates_from_perf(s.perf, s.name, s.model, s.variant, 0.0, 100), 0.0)
                rows += [replace(r, source=P.ProfileSource.PROFILER) for r in pr]
        self.table = P.ProfileTable.from_rows(rows)
        self._heartbeat(0.0)
        self._feed(self.core.handle(ProfilesUpdated(self.table), 0.0), 0.0)

    def make_core(self, config: CoreConfig, seed: int) -> ControlCore:
        return ControlCore(config, self.opt.store, seed=seed)

    # ------------------------------------------------------------------ the fleet as heartbeats report it
    def _heartbeat(self, now: float) -> None:
        """Each pool as its workers' heartbeats report it (streams/views.py aggregates them)."""
        self.hb_t = now
        states = []
        for i, p in enumerate(self.sim.pools):
            spec, cap = p.spec, p.spec.perf.kv_capacity
            free = [max(cap - inst.kv_used, 0.0) for inst in p.instances if inst.alive]
            states.append(P.PoolState(
                name=spec.name, alive=p.alive and bool(free), phases=self.phases[i], models=frozenset({spec.model}),
                variant=spec.variant, workers=p.alive_instances, max_batch=spec.perf.max_batch,
                free_kv_bytes=sum(free), queue_requests=len(p.q_pre) + len(p.q_dec),
                queue_tokens=p.q_pre_tokens + p.q_dec_tokens, last_heartbeat=now, price_per_hour=spec.cost_per_hour,
                worker_free_kv_bytes=max(free, default=0.0) if self.opt.per_worker_kv else None,
                worker_kv_capacity_bytes=cap if self.opt.per_worker_kv else None,
                kv_format=f"{spec.model}|{spec.perf.kv_per_token:.0f}B/token",  # one layout per model here
            ))
        self.core.handle(FleetObserved(tuple(states)), now)

    # ------------------------------------------------------------------ the control loop
    def _start_ticking(self, now: float) -> None:
        if not self.ticking:
            self.ticking = True
            self.sim.push(now, TICK)

    def on_tick(self, now: float) -> None:
        if now - self.hb_t >= self.opt.heartbeat_s:
            self._heartbeat(now)
        self._feed(self.control.tick(now), now)
        while self.core.more_to_release:  # a tick releases a bounded slice: the rest goes at this instant
            self._feed(self.core.tick(now), now)
        reports, counters = self.core.reports, self.sim.counters
        counters["no_placement"] = reports.unplaced
        counters["retries"] = reports.retries + reports.redispatched
        if self.core.dispatch.requests or self.core.jobs.open:
            self.sim.push(now + self.tick_s, TICK)
        else:
            self.ticking = False

    def _feed(self, decisions: list[Any], now: float) -> None:
        for d in decisions:
            kind = type(d)
            if kind is Dispatch:
                self._place(d)
            elif kind is QueueRequest:
                self._feed(self.control.handle(d.request, now), now)
            elif kind is FailRequest:
                self._fail(d, now)
            elif kind is Problem:
                self.problems.append(d)

    def _place(self, d: Dispatch) -> None:
        sim = self.sim
        row = self.row_of[d.work.request_id]
        if d.speculative or sim.status[row] not in (NEW, LOST):
            # a copy beside a running attempt; or a re-dispatch of work still queued on a pool the
            # heartbeats call dead (live, that work stays in the pool's topic and may run too):
            # the first of the two to finish wins
            if row in sim.twin:
                return  # it has its copy already
            row = sim.twin_of(row)
            self.rid.append(d.work.request_id)
        self.row_attempt[row] = d.attempt
        if row < sim.w.n_requests and row not in self.placed:  # the engine's release metrics
            self.placed.add(row)
            t, tokens = sim.req_tenant[row], sim.prompt[row] + sim.output[row]
            sim.tenant_waiting[t] -= 1
            sim.tenant_released[t] += tokens
            sim.inflight += 1
            sim.inflight_tokens += tokens
        sim.place(row, self.index[d.prefill_pool], self.index[d.decode_pool])

    def _fail(self, d: FailRequest, now: float) -> None:
        sim, row = self.sim, self.row_of[d.work.request_id]
        if sim.status[row] not in (DONE, GAVE_UP):
            if row in self.placed:
                sim.inflight -= 1
                sim.inflight_tokens -= sim.prompt[row] + sim.output[row]
            sim._give_up(row, d.reason)
        self._result(ResultReceived(d.work.request_id, d.work.job_id, False, d.work.prompt_tokens, 0), now)

    def _result(self, result: ResultReceived, now: float) -> None:
        """A result reaches the core and, the first one per request, the sink: its receipt (the
        job's output tallies) goes to the tracker."""
        first = result.request_id in self.core.dispatch.requests and \
            not self.core.dispatch.requests[result.request_id].status.is_finished
        self._feed(self.control.handle(result, now), now)
        if not first:
            return
        tally = self.outputs.setdefault(result.job_id, [0, 0, 0, 0, 0])
        tally[0] += 1
        tally[1 if result.ok else 2] += 1
        if result.ok:
            tally[3] += result.prompt_tokens
            tally[4] += result.completion_tokens
        self._feed(self.control.handle(OutputWritten(result.job_id, *tally), now), now)

    # ------------------------------------------------------------------ admission
    def submit(self, j: int, now: float) -> str | None:
        sim, w = self.sim, self.sim.w
        first, count = int(w.job_first[j]), int(w.job_count[j])
        tenant = w.tenants[int(w.job_tenant[j])]
        job_id = f"j{j}"
        prompts = tuple(PromptSize(str(i), sim.prompt[first + i], sim.output[first + i]) for i in range(count))
        for i in range(count):
            rid = P.request_id(job_id, str(i))
            self.rid[first + i] = rid
            self.row_of[rid] = first + i
        event = JobSubmitted(job_id, tenant.name, tenant.model, tenant.priority, now, float(w.job_deadline[j]),
                             QualityTier(tenant.quality.upper()), 0.0, 0.0, prompts)
        out = self.control.handle(event, now)
        rejected = next((d for d in out if isinstance(d, JobChanged) and d.kind is JobEventKind.REJECTED), None)
        self._feed(out, now)
        if rejected is not None:
            return rejected.reason
        self._start_ticking(now)
        return None

    def backlog(self) -> int:
        fair = self.core.dispatch.fair
        return sum(r.queued_requests for r in fair.report())

    def release(self, free: int, now: float) -> list[int]:
        return []  # the core releases on its own ticks

    def route(self, rid: int, now: float) -> tuple[int, int] | None:
        raise RuntimeError("the control core routes on its own ticks; the engine must not ask CoreDriver.route")

    # ------------------------------------------------------------------ what the fleet reports
    def on_kv_ready(self, row: int, now: float) -> None:
        rid = self.rid[row]
        self._feed(self.control.handle(KvReady(rid, self.row_attempt[row], self.names[self.sim.pre_pool[row]],
                                            self.names[self.sim.pre_pool[row]]), now), now)

    def on_done(self, row: int, now: float) -> None:
        rid, sim = self.rid[row], self.sim
        self._result(ResultReceived(rid, f"j{sim.job[row]}", True, sim.prompt[row], sim.output[row]), now)

    def on_lost(self, row: int, pool: int, now: float, cause: str, phase: Phase) -> object:
        """Worker death and refusals are failed attempts, as a supervisor or the worker reports
        them; a lost pool's work is silent (its heartbeats stop), except a KV in transfer from it,
        which the decode side cannot fetch."""
        sim = self.sim
        silent = cause == "pool_lost" and sim.lost_from != TRANSFER
        silent |= cause == "refused" and not sim.pools[pool].alive
        if not silent:
            kind = P.FailureKind.WORKER_DEATH if cause in ("worker_death", "pool_lost") else P.FailureKind.ERROR
            self._report_failed(row, pool, phase, kind, cause, now)
        return DEFERRED

    def on_cancel(self, row: int, now: float) -> None:
        """The engine withdrew the row (its twin finished first, or it was lost beside a running twin)."""
        if row in self.row_attempt:
            self._report_failed(row, self.sim.pre_pool[row], Phase.PREFILL, P.FailureKind.WORKER_DEATH, "cancelled",
                                now)

    def _report_failed(self, row: int, pool: int, phase: Phase, kind: P.FailureKind, cause: str, now: float) -> None:
        attempt = self.row_attempt.get(row)
        if attempt is None:
            return
        event = AttemptFailed(self.rid[row], attempt, self.names[pool], phase, kind, cause)
        self._feed(self.control.handle(event, now), now)

    def on_speculate(self, rid: int, copy: int, avoid: frozenset[str], now: float) -> None:
        raise RuntimeError("the control core places speculative copies itself")

    def give_up_unplaced(self, rid: int, since: float, now: float) -> bool:
        raise RuntimeError("the control core handles unplaced requests itself")

    # ------------------------------------------------------------------ profiles
    def refresh(self, now: float) -> None:
        if self.opt.profiles == "measured":
            phase_aggs, link_aggs = self.sim.tel.aggregates(now, self.sim.cfg.half_life_s)
            self.table = self.table.with_rows(
                P.build_profile_rows(self._policy_aggregates(phase_aggs), now, self.opt.builder),
                P.build_link_profiles(self._policy_links(link_aggs), now, self.opt.builder),
            )
        self._feed(self.core.handle(ProfilesUpdated(self.table), now), now)
        self.share_log.append({"t": now, "shares": self.core.dispatch.router_state.snapshot()})

    def _policy_aggregates(self, aggs: list[Any]) -> list[P.PhaseAggregate]:
        out = []
        for a in aggs:
            spec = self.sim.pools[a.pool].spec
            out.append(P.PhaseAggregate(
                spec.model, Phase.DECODE if a.phase == DECODE else Phase.PREFILL, spec.name, spec.variant,
                max(1, round(a.batch_mean)), max(1, int(a.steps)), a.tokens_per_s, a.p50_s, max(a.p50_s, a.p90_s),
                max(a.p50_s, a.p90_s, a.p99_s), 0, spec.perf.kv_per_token, spec.perf.kv_per_token, a.last_t,
            ))
        return out

    def _policy_links(self, aggs: list[Any]) -> list[P.LinkAggregate]:
        out = []
        pools = [p.spec for p in self.sim.pools]
        for a in aggs:
            for s in pools:
                for d in pools:
                    if s.parent == a.src and d.parent == a.dst and s.model == d.model:
                        latency = self.sim.fleet.links[(a.src, a.dst)].latency_s
                        out.append(P.LinkAggregate(s.name, d.name, max(1, int(a.transfers)), a.bytes, a.seconds,
                                                   a.last_t, latency))
        return out

