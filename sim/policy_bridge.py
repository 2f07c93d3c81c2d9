"""The phaseroute driver: the simulator's side of ``phaseroute.streams.policy``.

Every decision goes through the policy package, looked up on the module at call time (so a
test can instrument ``phaseroute.streams.policy`` and see the calls): ``admit`` per job,
``FairScheduler`` for release, ``route`` + ``RouterState`` per request, ``build_profile_rows``
/ ``build_link_profiles`` at each refresh, ``retry.next_step`` after a worker death and
``redispatch_lost`` after a pool loss. This file only translates: simulator state in (pool
state as heartbeats and consumer lag would report it, telemetry aggregates as ClickHouse
would compute them), decisions out. It holds no policy logic of its own.

Profiles: the router starts from DATASHEET rows (peak numbers) and PROFILER rows (a
microbenchmark of each pool at start, at a fixed 1,024-token context); TELEMETRY rows built
from the simulated executions replace them as they accrue. ``profiles="datasheet"`` is the
static-spec router: DATASHEET rows only, never refreshed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

from phaseroute.streams import policy as P
from phaseroute.sim.catalogue import load_catalogue
from phaseroute.sim.perfmodel import InstancePerf
from phaseroute.sim.telemetry import DECODE

PROFILE_CONTEXT = 1024       # context of the start-up microbenchmark (decode)
PROFILE_PROMPT = 1024        # prompt length of the start-up microbenchmark (prefill)


@dataclass
class PhaserouteOptions:
    profiles: str = "measured"                   # "measured" | "datasheet" (static-spec router)
    router: P.RouterConfig = field(default_factory=P.RouterConfig)
    admission: P.AdmissionConfig = field(default_factory=P.AdmissionConfig)
    retry: P.RetryConfig = field(default_factory=P.RetryConfig)
    builder: P.ProfileBuilderConfig = field(default_factory=P.ProfileBuilderConfig)
    fair: dict = field(default_factory=dict)     # FairConfig overrides (tenant weights come from the workload)
    admit_jobs: bool = True                      # False: admit everything (ablation)
    quota: P.TenantQuota = field(default_factory=lambda: P.TenantQuota(None, None))
    heartbeat_s: float = 1.0                     # free KV memory and failures are as of the last heartbeat
    per_worker_kv: bool = True                   # PoolState.worker_free_kv_bytes / worker_kv_capacity_bytes: the
    #                                              roomiest worker's free KV and one worker's KV capacity, as the live
    #                                              pool view reports them (False: only the pool's sum; ablation)


def _aggregates_from_perf(perf: InstancePerf, pool: str, model: str, variant: str, now: float,
                          samples: int) -> list:
    """Microbenchmark of one instance: decode at several batches, prefill at several prompt counts."""
    out = []
    batches = [b for b in (1, 4, 16, 64, 256) if b <= perf.max_batch
               and b * (PROFILE_CONTEXT + 1) * perf.kv_per_token <= perf.kv_capacity] or [1]
    for b in batches:
        step = perf.step_time(b, b * PROFILE_CONTEXT)
        out.append(P.PhaseAggregate(model, P.Phase.DECODE, pool, variant, b, samples, b / step, step, step, step, 0,
                                    perf.kv_per_token, perf.kv_per_token, now))
    for k in (1, 2, 4, 8):
        tokens = k * PROFILE_PROMPT
        step = perf.step_time(0, 0, tokens, PROFILE_PROMPT)
        out.append(P.PhaseAggregate(model, P.Phase.PREFILL, pool, variant, k, samples, tokens / step, step, step, step,
                                    0, perf.kv_per_token, perf.kv_per_token, now))
    return out


class PhaserouteDriver:
    def __init__(self, options: PhaserouteOptions | None = None, name: str | None = None):
        self.opt = options or PhaserouteOptions()
        self.name = name or ("static-spec" if self.opt.profiles == "datasheet" else "phaseroute")

    # ------------------------------------------------------------------ set-up
    def attach(self, sim) -> None:
        self.sim = sim
        w = sim.w
        self.rng = random.Random(sim.cfg.seed * 7919 + 1)
        self.names = [p.spec.name for p in sim.pools]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.phases = [frozenset(P.Phase(ph.upper()) for ph in p.spec.phases) for p in sim.pools]
        self.models = [frozenset({p.spec.model}) for p in sim.pools]
        cat = load_catalogue()
        self.model_specs = {m: P.ModelSpec(m, cat.models[m].context_tokens if m in cat.models else 131072)
                            for m in {t.model for t in w.tenants}}
        self.tenant_names = [t.name for t in w.tenants]
        weights = {t.name: t.weight for t in w.tenants}
        cap = max(512, sim.capacity_target())
        fair = {"tenant_weights": weights, "default_max_in_flight": cap, **self.opt.fair}
        self.scheduler = P.FairScheduler(P.FairConfig(**fair))
        self.work: dict[int, P.RequestWork] = {}
        self.rid_of: dict[str, int] = {}
        self.n_backlog = 0
        self.jobs_left: dict[int, list[int]] = {}     # admitted unfinished job -> [prefill tokens, decode tokens]
        self.history: dict[int, list] = {}
        self.hb_t = -math.inf
        self.hb_free_kv = [0.0] * len(sim.pools)
        self.hb_worker_kv: list[float | None] = [None] * len(sim.pools)
        self.hb_failures = [0] * len(sim.pools)
        self._pool_cache: list[tuple[tuple, P.PoolState] | None] = [None] * len(sim.pools)
        rows = []
        for p in sim.pools:
            s = p.spec
            ds = P.build_profile_rows(_aggregates_from_perf(s.datasheet, s.name, s.model, s.variant, 0.0, 1), 0.0)
            rows += [replace(r, source=P.ProfileSource.DATASHEET) for r in ds]
            if self.opt.profiles == "measured":
                pr = P.build_profile_rows(_aggregates_from_perf(s.perf, s.name, s.model, s.variant, 0.0, 100), 0.0)
                rows += [replace(r, source=P.ProfileSource.PROFILER) for r in pr]
        self.table = P.ProfileTable.from_rows(rows)
        self.state = P.RouterState()
        self.share_log: list[dict] = []
        self.state.refresh(self.pool_states(0.0), self.table, self.opt.router, 0.0)
        self.fleet_cost_per_s = self._fleet_cost_rate(0.0)

    # ------------------------------------------------------------------ views
    def _heartbeat(self, now: float) -> None:
        """Free KV summed over the pool's alive workers and the roomiest worker's, as the live
        pool view aggregates the workers' heartbeats (streams/views.py)."""
        self.hb_t = now
        for i, p in enumerate(self.sim.pools):
            cap = p.spec.perf.kv_capacity
            free = [max(cap - inst.kv_used, 0.0) for inst in p.instances if inst.alive]
            self.hb_free_kv[i] = sum(free)
            self.hb_worker_kv[i] = max(free, default=0.0) if self.opt.per_worker_kv else None
            self.hb_failures[i] = sum(1 for t in p.failure_times if now - t < 600.0)

    def pool_states(self, now: float) -> list:
        """Each pool as the live pool view reports it: free KV and failures as of the last
        heartbeat (``last_heartbeat``), queues and in-flight counts as of now. A pool whose
        numbers did not change since the last call keeps its PoolState object (routing one
        request changes one pool's queue; the other pools are asked about again at once)."""
        if now - self.hb_t >= self.opt.heartbeat_s:
            self._heartbeat(now)
        out = []
        cache = self._pool_cache
        for i, p in enumerate(self.sim.pools):
            key = (p.alive, p.alive_instances, self.hb_free_kv[i], len(p.q_pre) + len(p.q_dec),
                   p.q_pre_tokens + p.q_dec_tokens, p.running, self.hb_failures[i], self.hb_t, self.hb_worker_kv[i],
                   p.spec.perf.kv_capacity if self.opt.per_worker_kv else None)
            hit = cache[i]
            if hit is not None and hit[0] == key:
                out.append(hit[1])
                continue
            spec = p.spec
            state = P.PoolState(
                name=spec.name, alive=key[0], phases=self.phases[i], models=self.models[i], variant=spec.variant,
                workers=key[1], max_batch=spec.perf.max_batch, free_kv_bytes=max(key[2], 0.0),
                queue_requests=key[3], queue_tokens=key[4], in_flight=key[5], recent_failures=key[6],
                last_heartbeat=self.hb_t, price_per_hour=spec.cost_per_hour, worker_free_kv_bytes=key[8],
                worker_kv_capacity_bytes=key[9],
            )
            cache[i] = (key, state)
            out.append(state)
        return out

    def _fleet_cost_rate(self, now: float) -> float | None:
        """Measured fleet throughput in the scheduler's cost units per second (for deadline slack)."""
        w = self.sim.w
        pools = self.pool_states(now)
        fair = self.scheduler.config
        total_in, total_out = float(w.req_prompt.sum()), float(w.req_output.sum())
        rate = 0.0
        for model in self.model_specs:
            pre = P.fleet_tokens_per_s(model, P.Phase.PREFILL, pools, self.table, now, self.opt.router.confidence)
            dec = P.fleet_tokens_per_s(model, P.Phase.DECODE, pools, self.table, now, self.opt.router.confidence)
            if pre > 0 and dec > 0:
                rate += fair.cost(total_in, total_out) / (total_in / pre + total_out / dec)
        return rate or None

    # ------------------------------------------------------------------ admission and release
    def submit(self, j: int, now: float) -> str | None:
        sim, w = self.sim, self.sim.w
        first, count = int(w.job_first[j]), int(w.job_count[j])
        tenant = w.tenants[int(w.job_tenant[j])]
        prompts = tuple(sim.prompt[first:first + count])
        outputs = sim.output[first:first + count]
        job_id = f"j{j}"
        deadline = float(w.job_deadline[j])
        tier = P.QualityTier(tenant.quality.upper())
        spec = P.JobSpec(job_id, tenant.name, tenant.model, prompts, max(outputs), deadline, tier, 0.0,
                         tenant.priority, output_tokens=tuple(outputs))
        if self.opt.admit_jobs:
            backlog = [P.BacklogJob(f"j{k}", w.tenants[int(w.job_tenant[k])].name,
                                    w.tenants[int(w.job_tenant[k])].model, float(w.job_deadline[k]), v[0], v[1])
                       for k, v in self.jobs_left.items()]
            verdict = P.admit(spec, backlog, self.table, self.pool_states(now), self.model_specs,
                              {}, replace(self.opt.admission, default_quota=self.opt.quota), now)
            if isinstance(verdict, P.Rejected):
                return f"{verdict.code.value}: {verdict.reason}"
            requests = verdict.requests
        else:
            requests = P.split_job(spec)
        self.jobs_left[j] = [sum(prompts), sum(outputs)]
        for rid, rw in enumerate(requests, start=first):
            self.work[rid] = rw
            self.rid_of[rw.request_id] = rid
            self.scheduler.enqueue(rw, now)
        self.n_backlog += count
        return None

    def backlog(self) -> int:
        return self.n_backlog

    def release(self, free: int, now: float) -> list[int]:
        out = self.scheduler.schedule(P.FreeCapacity(free), now, self.fleet_cost_per_s)
        rids = [self.rid_of[r.request.request_id] for r in out.releases]
        self.n_backlog -= len(rids)
        return rids

    # ------------------------------------------------------------------ routing
    def route(self, rid: int, now: float) -> tuple[int, int] | None:
        rw = self.work[rid]
        decision = P.route(rw, self.pool_states(now), self.table, self.state, self.opt.router, now, self.rng)
        if isinstance(decision, P.NoPlacement):
            return None
        self.state.record(decision, rw, now, self.opt.router)
        return self.index[decision.prefill_pool], self.index[decision.decode_pool]

    # ------------------------------------------------------------------ outcomes
    def on_done(self, rid: int, now: float) -> None:
        rw = self.work.pop(rid)
        self.rid_of.pop(rw.request_id, None)
        self.scheduler.on_finished(rw.request_id, now, rw.max_output_tokens)
        self.history.pop(rid, None)
        j = self.sim.job[rid]
        left = self.jobs_left.get(j)
        if left is not None:
            left[0] -= rw.prompt_tokens
            left[1] -= rw.max_output_tokens
            if self.sim.job_left[j] <= 1:
                del self.jobs_left[j]

    def on_lost(self, rid: int, pool: int, now: float, cause: str, phase: str) -> float | None:
        rw = self.work[rid]
        sim = self.sim
        name = self.names[pool]
        if cause == "pool_lost":
            dead = P.dead_pools(self.pool_states(now), now, self.opt.router.heartbeat_timeout_s) | {name}
            attempt = P.InFlightAttempt(rw.request_id, P.Phase(phase.upper()), sim.attempt[rid] - 1, name, sim.attempt[rid])
            redo = P.redispatch_lost([attempt], frozenset(dead))
            if redo:
                self.work[rid] = replace(rw, attempt=sim.attempt[rid], avoid_pools=rw.avoid_pools | redo[0].avoid_pools)
                return now
        kind = P.FailureKind.WORKER_DEATH if cause == "worker_death" else P.FailureKind.ERROR
        record = P.AttemptRecord(rw.request_id, P.Phase(phase.upper()), sim.attempt[rid] - 1, name, P.AttemptStatus.FAILED,
                                 now, now, kind, cause, kv_lost=phase == "decode")
        history = self.history.setdefault(rid, [])
        history.append(record)
        step = P.next_step(history, now, self.opt.retry, self.rng)
        if isinstance(step, P.GiveUp):
            self.scheduler.on_finished(rw.request_id, now, 0)
            return None
        self.work[rid] = replace(rw, attempt=sim.attempt[rid], avoid_pools=step.avoid_pools)
        return step.at

    def give_up_unplaced(self, rid: int, since: float, now: float) -> bool:
        """As the live control plane: ``give_up_unplaced`` ends the wait of a request no pool placed."""
        rw = self.work[rid]
        if P.give_up_unplaced(rw.request_id, rw.deadline, since, now, "no placement", self.opt.retry) is None:
            return False
        self.scheduler.on_finished(rw.request_id, now, 0)
        return True

    # ------------------------------------------------------------------ stragglers
    def stragglers(self, running: list[tuple], now: float) -> list[tuple[int, frozenset[str]]]:
        """Which running attempts get a speculative copy (``find_stragglers`` decides)."""
        attempts, rid_of = [], {}
        for rid, phase, pool, started, tokens, batch in running:
            rw = self.work[rid]
            rid_of[rw.request_id] = rid
            attempts.append(P.RunningAttempt(rw.request_id, P.Phase(phase.upper()), rw.attempt, self.names[pool], rw.model,
                                             started, tokens, max(1, batch), rw.attempt + 1))
        copies = P.find_stragglers(attempts, self.table, self.pool_states(now), now, self.opt.retry)
        return [(rid_of[c.request_id], c.avoid_pools) for c in copies]

    def on_speculate(self, rid: int, copy: int, avoid: frozenset[str], now: float) -> None:
        rw = self.work[rid]
        self.work[copy] = replace(rw, attempt=rw.attempt + 1, avoid_pools=rw.avoid_pools | avoid)

    def on_cancel(self, rid: int, now: float) -> None:
        self.work.pop(rid, None)
        self.history.pop(rid, None)

    # ------------------------------------------------------------------ profiles
    def refresh(self, now: float) -> None:
        if self.opt.profiles == "measured":
            phase_aggs, link_aggs = self.sim.tel.aggregates(now, self.sim.cfg.half_life_s)
            self.table = self.table.with_rows(
                P.build_profile_rows(self._policy_aggregates(phase_aggs), now, self.opt.builder),
                P.build_link_profiles(self._policy_links(link_aggs), now, self.opt.builder),
            )
        self.state.refresh(self.pool_states(now), self.table, self.opt.router, now)
        self.fleet_cost_per_s = self._fleet_cost_rate(now)
        self.share_log.append({"t": now, "shares": self.state.snapshot()})

    def _policy_aggregates(self, aggs) -> list:
        out = []
        for a in aggs:
            spec = self.sim.pools[a.pool].spec
            out.append(P.PhaseAggregate(
                spec.model, P.Phase.DECODE if a.phase == DECODE else P.Phase.PREFILL, spec.name, spec.variant,
                max(1, round(a.batch_mean)), max(1, int(a.steps)), a.tokens_per_s, a.p50_s, max(a.p50_s, a.p90_s),
                max(a.p50_s, a.p90_s, a.p99_s), 0, spec.perf.kv_per_token, spec.perf.kv_per_token, a.last_t,
            ))
        return out

    def _policy_links(self, aggs) -> list:
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
