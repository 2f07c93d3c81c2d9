"""The control plane's logic between Kafka events and the pure policy, without Faust.

Life of a job through the control plane:
1. ``submit`` (``jobs.submitted``): an id seen before is not run twice (its state is re-sent).
   Otherwise its prompts are read and counted, and ``policy.admit`` decides: REJECTED with a
   reason (and the earliest feasible deadline), or ADMITTED — its requests go to
   ``requests.pending`` (key tenant) and the job to the ``jobs`` table.
2. ``pending`` (``requests.pending``): each request enters the ``requests`` table (status
   pending) and the fair scheduler's per-tenant queue.
3. ``tick`` (a timer, and after every event): the fair scheduler releases work up to the
   capacity the live pools have (backpressure); the router picks, per request, a colocated pool
   or a prefill and a decode pool from the measured profile table, and ``prefill.<pool>``
   receives the work. Due retries, stragglers (speculative copies) and pools whose heartbeats
   stopped (in-flight work re-dispatched) are handled here too.
4. ``kv_ready`` / ``result`` / ``attempt_failed``: the request moves on, finishes (first result
   wins; later copies are ignored by id), or is retried with backoff away from the pool that
   failed, up to a limit, then fails with its history.
5. ``output_written`` (``results.written``): the result sink's receipt of how many output lines
   are fsynced. A job gets COMPLETED/FAILED when every request has a result and a line on disk.
The ``jobs``, ``requests`` and ``fairness`` mappings are Faust tables in production
(changelog-backed, so a restarted control plane rebuilds them from Kafka, re-queues what was
pending and gives the fair scheduler back each tenant's counter and running requests); every
decision that leaves this class is a ``Send``.
"""

from __future__ import annotations

import logging
import random
from datetime import datetime, timezone
from collections.abc import Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from phaseroute.infra.blobstore import BlobStore, open_blob_store, output_prefix
from phaseroute.schemas.ids import attempt_id, job_id_problem
from phaseroute.streams import records
from phaseroute.streams.intake import IntakeLimits, IntakeScan, scan_job_input
from phaseroute.streams.validation_report import write_validation_errors
from phaseroute.streams.model_catalog import ModelInfo
from phaseroute.streams.policy import (
    AdmissionConfig, AttemptRecord, AttemptStatus, BacklogJob, FailureKind, FairConfig, FairScheduler,
    FreeCapacity, GiveUp, InFlightAttempt, JobSpec, ModelSpec, NoPlacement, Phase, PoolState, QualityTier,
    RequestWork, RetryConfig, RouterConfig, RouterState, RunningAttempt, TenantQuota, admit, dead_pools,
    find_stragglers, give_up_unplaced, next_step, redispatch_lost, route,
)
from phaseroute.streams.policy import Admitted
from phaseroute.streams.records import Send
from phaseroute.streams.views import PoolView, ProfileView

log = logging.getLogger(__name__)
OPEN = ("pending", "dispatched", "retry")


@dataclass
class ControlConfig:
    router: RouterConfig = field(default_factory=RouterConfig)
    fair: FairConfig = field(default_factory=FairConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    quotas: dict[str, TenantQuota] = field(default_factory=dict)
    slots_per_worker: int = 1  # dispatched-but-unfinished requests per slot of a worker's max batch
    heartbeat_timeout_s: float = 8.0
    progress_every: int = 5
    results_dir: str = "."
    blob_store_url: str | None = None  # where input files are read and validation errors written
    intake: IntakeLimits = field(default_factory=IntakeLimits)


@dataclass
class Reports:
    """Counters for the demo summary and `phaseroute status`."""

    colocated: int = 0
    disaggregated: int = 0
    explored: int = 0
    retries: int = 0
    speculative: int = 0
    redispatched: int = 0
    by_pool: dict[str, int] = field(default_factory=dict)


class ControlPlane:
    def __init__(self, jobs: MutableMapping[str, Any], requests: MutableMapping[str, Any], profiles: ProfileView,
                 pools: PoolView, models: dict[str, ModelInfo], config: ControlConfig, seed: int = 0,
                 fairness: MutableMapping[str, Any] | None = None) -> None:
        self.jobs, self.requests = jobs, requests
        self.fairness: MutableMapping[str, Any] = {} if fairness is None else fairness  # tenant -> saved VTC state
        self._fairness_saved: dict[str, tuple[float, float]] = {}
        self.profiles, self.pools = profiles, pools
        self.models = models
        self.config = config
        self.fair = FairScheduler(config.fair)
        self.router_state = RouterState()
        self.rng = random.Random(seed)
        self.reports = Reports()
        self._profile_version = -1
        self._failures: dict[str, int] = {}
        self._queued: set[str] = set()  # request ids in the fair scheduler's queues
        self.store: BlobStore | None = open_blob_store(config.blob_store_url) if config.blob_store_url else None

    def _enqueue(self, rid: str, req: dict[str, Any], now: float) -> None:
        if rid not in self._queued:
            self._queued.add(rid)
            self.fair.enqueue(self._work(rid, req), now)

    # -- restart -------------------------------------------------------------------------
    def restore(self, now: float) -> int:
        """Restore the fair scheduler's tenant counters and running requests, and re-queue every
        request the tables say is pending, or was failing when the process stopped (its failed
        result may not have been sent: it gives up again on its next tick; a result sent twice
        counts once)."""
        saved = {t: (v["counter"], v["served_cost"]) for t, v in self.fairness.items()}
        self.fair.restore(saved)
        self._fairness_saved = dict(saved)
        n = 0
        for rid, req in list(self.requests.items()):
            if req["status"] == "dispatched":  # still running somewhere: it holds its tenant's slot again
                self.fair.resume(self._work(rid, req))
            if req["status"] == "failing":
                req = self.requests[rid] = dict(req, status="pending")
            if req["status"] == "pending" and rid not in self._queued:
                self._enqueue(rid, req, now)
                n += 1
        return n

    # -- events -------------------------------------------------------------------------
    def scan(self, job: dict[str, Any]) -> IntakeScan | None:
        """Read, validate, render and count the job's input (blocking: run it in a worker thread).
        None when the job needs no scan (known id, bad id, unknown model): ``submit`` answers it."""
        model = self.models.get(job["model"])
        if job["job_id"] in self.jobs or job_id_problem(job["job_id"]) or model is None:
            return None
        return scan_job_input(job, self.store, model, self.config.intake)

    def submit(self, job: dict[str, Any], now: float, scan: IntakeScan | None = None) -> Iterable[Send]:
        """Admit or reject a job. ``scan`` is ``self.scan(job)`` done beforehand off the event
        loop (computed here when not given). The request sends are produced lazily, prompt by
        prompt from the scan's spool, so a large job never sits in memory as records."""
        known = self.jobs.get(job["job_id"])
        if known is not None:  # idempotent resubmission: say where it stands, run nothing
            return records.job_event_sends(known, known["state"], now, reason="job id already submitted; not run again")
        entry = self._job_entry(job)
        problem = job_id_problem(job["job_id"])
        if problem:
            return self._reject(entry, problem, None, now)
        model = self.models.get(job["model"])
        if model is None:
            return self._reject(entry, f"unknown model {job['model']!r}; this deployment serves {sorted(self.models)}", None, now)
        scan = scan if scan is not None else self.scan(job)
        assert scan is not None
        if not scan.ok:
            scan.close()
            if scan.errors and self.store is not None:
                write_validation_errors(self.store, job["tenant"], job["job_id"], scan)
            return self._reject(entry, scan.reason(), None, now)
        prompts = scan.prompts
        spec = JobSpec(
            job_id=job["job_id"], tenant=job["tenant"], model=job["model"], prompt_tokens=tuple(p.tokens for p in prompts),
            max_output_tokens=max((p.max_tokens for p in prompts), default=int(job["sampling"]["max_tokens"])),
            deadline=job["deadline"] / 1000, quality_tier=QualityTier(job["quality_tier"].lower()),
            quality_tolerance=job.get("quality_tolerance") or 0.0, priority=job["priority"],
            custom_ids=tuple(p.custom_id for p in prompts), output_tokens=tuple(p.max_tokens for p in prompts),
        )
        if job["sampling"].get("temperature", 0.0) > 0:
            scan.close()
            return self._reject(entry, (
                f"sampling.temperature={job['sampling']['temperature']}: the torch backend decodes greedily only; "
                "submit with temperature 0"), None, now)
        verdict = admit(spec, self._backlog(), self.profiles.table(), tuple(self._pool_states(now).values()),
                        {n: ModelSpec(n, m.context_tokens) for n, m in self.models.items()},
                        self.config.quotas, self.config.admission, now)
        if not isinstance(verdict, Admitted):
            scan.close()
            return self._reject(entry, verdict.reason, verdict.earliest_feasible_deadline, now)
        entry.update(state="ADMITTED", requests_total=len(prompts), est_completion=verdict.estimated_completion,
                     tokens_in=0, output_file=self._output_location(job))
        return self._admitted_sends(job, entry, verdict, scan, now)

    def _output_location(self, job: dict[str, Any]) -> str:
        if self.store is not None:
            return output_prefix(job["tenant"], job["job_id"])
        return f"{self.config.results_dir}/{job['job_id']}.jsonl"

    def _admitted_sends(self, job: dict[str, Any], entry: dict[str, Any], verdict: Admitted, scan: IntakeScan,
                        now: float) -> Iterator[Send]:
        """The job enters the table, and its ADMITTED event goes out, before its first request is
        sent (the table was written before any send before the sends were streamed too): results
        of early requests may come back while later ones are still being sent, and they count
        against this entry. A crash while the requests stream leaves the job ADMITTED with
        requests missing, as a crash between the sends did before; the new core should close
        that (for example with a transactional producer)."""
        self.jobs[job["job_id"]] = entry
        yield from records.job_event_sends(entry, "ADMITTED", now, reason=(
            f"estimated completion in {verdict.estimated_completion - now:.0f} s"))
        try:
            for work, prompt, text in zip(verdict.requests, scan.prompts, scan.texts()):
                yield Send("requests.pending", job["tenant"], "request", {
                    "request_id": work.request_id, "job_id": job["job_id"], "tenant": job["tenant"],
                    "custom_id": prompt.custom_id, "priority": job["priority"], "submitted_at": job["submitted_at"],
                    "deadline": job["deadline"], "model": job["model"], "prompt": text, "prompt_tokens": prompt.tokens,
                    "max_tokens": prompt.max_tokens, "sampling": job["sampling"], "quality_tier": job["quality_tier"],
                    "quality_tolerance": job.get("quality_tolerance"),
                })
        finally:
            scan.close()

    def pending(self, request: dict[str, Any], now: float) -> list[Send]:
        rid = request["request_id"]
        if rid in self.requests or self.jobs.get(request["job_id"], {}).get("state") in ("CANCELLED",):
            return []
        req = {k: request[k] for k in ("job_id", "tenant", "custom_id", "prompt", "prompt_tokens", "max_tokens",
                                        "model", "priority", "sampling", "quality_tier", "quality_tolerance")}
        req.update(deadline_ms=request["deadline"], status="pending", attempt=0, history=[], kv=None,
                   prefill_pool=None, decode_pool=None, colocated=False, dispatched_at=None, retry_at=None, avoid=[])
        self.requests[rid] = req
        self._enqueue(rid, req, now)
        return []

    def kv_ready(self, event: dict[str, Any], now: float) -> list[Send]:
        rid = event["request_id"]
        req = self.requests.get(rid)
        if req is None or req["status"] != "dispatched" or event["attempt_id"] != req.get("attempt_id"):
            return []  # a replay or a superseded attempt
        req = dict(req)
        req["kv"] = {k: event[k] for k in ("attempt_id", "kv_location", "kv_bytes", "kv_checksum", "kv_layout_version",
                                            "prompt_tokens", "first_token", "prefill_time_s", "prefill_pool")}
        req["phase"] = "decode"
        req["started_at"] = now
        self.requests[rid] = req
        return []

    def result(self, result: dict[str, Any], now: float) -> list[Send]:
        rid = result["request_id"]
        req = self.requests.get(rid)
        if req is None or req["status"] in ("done", "failed", "cancelled"):
            return []  # first result wins: a speculative copy or a replay
        req = dict(req, status="done" if result["status"] == "OK" else "failed")
        self.requests[rid] = req
        self.fair.on_finished(rid, now, result["completion_tokens"])
        job = dict(self.jobs[req["job_id"]])
        ok = result["status"] == "OK"
        job["done" if ok else "failed"] += 1
        job["tokens_in"] += result["prompt_tokens"]
        job["tokens_out"] += result["completion_tokens"]
        sends: list[Send] = []
        if job["state"] == "ADMITTED":
            job["state"] = "RUNNING"
            sends += records.job_event_sends(job, "RUNNING", now)
        finished = job["done"] + job["failed"]
        if finished >= job["requests_total"]:
            sends += self._finish_if_written(job, now)
        elif finished % self.config.progress_every == 0:
            sends += records.job_event_sends(job, "PROGRESS", now, seq=finished)
        self.jobs[req["job_id"]] = job
        return sends

    def output_written(self, receipt: dict[str, Any], now: float) -> list[Send]:
        """The result sink fsynced ``lines`` of the job's output file; a replayed receipt only repeats a count."""
        known = self.jobs.get(receipt["job_id"])
        if known is None or known["state"] not in ("ADMITTED", "RUNNING"):
            return []
        job = dict(known, lines_written=max(known.get("lines_written", 0), receipt["lines"]))
        sends = self._finish_if_written(job, now)
        self.jobs[receipt["job_id"]] = job
        return sends

    def _finish_if_written(self, job: dict[str, Any], now: float) -> list[Send]:
        """COMPLETED/FAILED once every request has a result AND the sink has its line on disk: a
        finished job's output file is whole when its final event is read. Updates ``job`` in place."""
        total = job["requests_total"]
        if job["done"] + job["failed"] < total or job.get("lines_written", 0) < total:
            return []
        job["state"] = "COMPLETED" if job["done"] else "FAILED"
        job["finished_at"] = now
        return records.job_event_sends(job, job["state"], now)

    def attempt_failed(self, event: dict[str, Any], now: float) -> list[Send]:
        rid = event["request_id"]
        req = self.requests.get(rid)
        if req is None or req["status"] != "dispatched" or event["attempt_id"] not in (req.get("attempt_id"), req.get("decode_attempt_id")):
            return []
        self._failures[event["pool"]] = self._failures.get(event["pool"], 0) + 1
        kind = FailureKind.KV_CHECKSUM if event["error_class"] == "KVIntegrityError" else (
            FailureKind.ERROR if event["retryable"] else FailureKind.INVALID)
        return self._failed(rid, req, event["pool"], Phase(event["phase"].lower()), kind, event["error"], now)

    def cancel(self, command: dict[str, Any], now: float) -> list[Send]:
        job = self.jobs.get(command["job_id"])
        if job is None or job["tenant"] != command["tenant"] or job["state"] in ("COMPLETED", "FAILED", "CANCELLED", "REJECTED"):
            return []
        for work in self.fair.cancel_job(command["job_id"]):
            self._queued.discard(work.request_id)
        for rid, req in list(self.requests.items()):
            if req["job_id"] == command["job_id"] and req["status"] in OPEN:
                self.requests[rid] = dict(req, status="cancelled")
        job = dict(job, state="CANCELLED", finished_at=now)
        self.jobs[command["job_id"]] = job
        return records.job_event_sends(job, "CANCELLED", now, reason=command.get("reason") or "cancelled by the tenant")

    # -- the clock --------------------------------------------------------------------------
    def tick(self, now: float) -> list[Send]:
        """Release and route work within capacity; retries, stragglers and dead pools."""
        pools = self._pool_states(now)
        if self.profiles.version != self._profile_version:
            self._profile_version = self.profiles.version
            self.router_state.refresh(tuple(pools.values()), self.profiles.table(), self.config.router, now)
        sends = self._requeue_due(now) + self._handle_dead_pools(pools, now) + self._speculate(pools, now)
        sends += self._release(pools, now)
        self._save_fairness()
        return sends

    def _release(self, pools: dict[str, PoolState], now: float) -> list[Send]:
        """The fair scheduler releases up to the free capacity; the router places each release."""
        sends: list[Send] = []
        free = self._free_slots(pools)
        if free <= 0:
            return sends
        table = self.profiles.table()
        for release in self.fair.schedule(FreeCapacity(free), now).releases:
            rid = release.request.request_id
            self._queued.discard(rid)
            req = self.requests.get(rid)
            if req is None or req["status"] != "pending":
                self.fair.on_finished(rid, now, 0)
                continue
            sent = self._dispatch(rid, req, release.request, pools, table, now)
            if isinstance(sent, NoPlacement):
                self.fair.on_finished(rid, now, 0)
                sends += self._unplaced(rid, req, sent, now)
            else:
                sends += sent
        return sends

    # -- internals -----------------------------------------------------------------------
    def _save_fairness(self) -> None:
        """Write each tenant whose VTC state changed since the last write (a restart loses at most
        the corrections of results since the last tick)."""
        for tenant, value in self.fair.state().items():
            if self._fairness_saved.get(tenant) != value:
                self.fairness[tenant] = {"counter": value[0], "served_cost": value[1]}
                self._fairness_saved[tenant] = value

    def _dispatch(self, rid: str, req: dict[str, Any], work: RequestWork, pools: dict[str, PoolState],
                  table: Any, now: float) -> list[Send] | NoPlacement:
        decision = route(work, tuple(pools.values()), table, self.router_state, self.config.router, now, self.rng)
        if isinstance(decision, NoPlacement):
            return decision
        self.router_state.record(decision, work, now, self.config.router)
        attempt = req["attempt"]
        prefill_id = attempt_id(rid, "prefill", attempt)
        decode_id = attempt_id(rid, "decode", attempt)
        history = list(req["history"]) + [{"phase": "prefill", "attempt": attempt, "pool": decision.prefill_pool,
                                           "started_at": now}]
        self.requests[rid] = dict(
            req, status="dispatched", attempt=attempt + 1, attempt_id=prefill_id,
            decode_attempt_id=decode_id, prefill_pool=decision.prefill_pool, decode_pool=decision.decode_pool,
            colocated=decision.colocated, dispatched_at=now, started_at=now, phase="prefill", kv=None, history=history,
            unplaced_since=None,
        )
        self.reports.colocated += decision.colocated
        self.reports.disaggregated += not decision.colocated
        self.reports.explored += decision.explored
        for pool in {decision.prefill_pool, decision.decode_pool}:
            self.reports.by_pool[pool] = self.reports.by_pool.get(pool, 0) + 1
        record = records.prefill_work(rid, req, prefill_id, attempt, decision.prefill_pool, decision.decode_pool,
                                      decision.colocated, now)
        return [Send(f"prefill.{decision.prefill_pool}", rid, "prefill_work", record)]

    def _unplaced(self, rid: str, req: dict[str, Any], refusal: NoPlacement, now: float) -> list[Send]:
        """No pool can take the request now: back to its queue, tried again next tick, until
        ``give_up_unplaced`` ends a wait that outlived its deadline (a failed result with the reason)."""
        since = req.get("unplaced_since")
        if since is None:
            log.info("no placement for %s: %s", rid, refusal.explain())
            req = self.requests[rid] = dict(req, unplaced_since=now)
            since = now
        deadline = req["deadline_ms"] / 1000 if req.get("deadline_ms") is not None else None
        step = give_up_unplaced(rid, deadline, since, now, refusal.explain(), self.config.retry)
        if step is not None:
            self.requests[rid] = dict(req, status="failing")  # the failed result below finishes it
            return [Send("results", req["job_id"], "result", records.failed_result(rid, req, step.reason, now))]
        self._enqueue(rid, req, now)
        return []

    def _failed(self, rid: str, req: dict[str, Any], pool: str, phase: Phase, kind: FailureKind, detail: str,
                now: float) -> list[Send]:
        history = [self._attempt_record(rid, h) for h in req["history"][:-1]]
        last = req["history"][-1] if req["history"] else {"phase": phase.value, "attempt": max(0, req["attempt"] - 1), "started_at": now}
        history.append(AttemptRecord(rid, phase, last["attempt"], pool, AttemptStatus.FAILED, last["started_at"], now,
                                     kind, detail, kv_lost=kind is FailureKind.KV_CHECKSUM))
        step = next_step(history, now, self.config.retry, self.rng)
        hist = list(req["history"])
        if hist:
            hist[-1] = dict(hist[-1], failed=kind.value, detail=detail[:300], ended_at=now, pool=pool)
        if isinstance(step, GiveUp):
            self.requests[rid] = dict(req, status="dispatched", history=hist)
            return [Send("results", req["job_id"], "result", records.failed_result(rid, req, step.reason, now))]
        self.reports.retries += 1
        self.requests[rid] = dict(req, status="retry", retry_at=step.at, avoid=sorted(step.avoid_pools), history=hist)
        return []

    def _requeue_due(self, now: float) -> list[Send]:
        for rid, req in list(self.requests.items()):
            if req["status"] == "retry" and req["retry_at"] <= now:
                req = dict(req, status="pending")
                self.requests[rid] = req
                self._enqueue(rid, req, now)
        return []

    def _free_slots(self, pools: dict[str, PoolState]) -> int:
        """Backpressure: requests the fleet can take now. Every request needs prefill and decode, so
        the free prefill slots are capped by the decode concurrency left (dispatched requests count
        against it wherever they are)."""
        live = [p for p in pools.values() if p.alive]
        slots = self.config.slots_per_worker
        prefill = sum(max(0, p.workers * p.max_batch * slots - p.in_flight) for p in live if Phase.PREFILL in p.phases)
        decode_capacity = sum(p.workers * p.max_batch * slots for p in live if Phase.DECODE in p.phases)
        in_flight = sum(p.in_flight for p in pools.values())
        return min(prefill, max(0, decode_capacity - in_flight))

    def _in_flight(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for req in self.requests.values():
            if req["status"] == "dispatched":
                pool = req["decode_pool"] if req.get("phase") == "decode" else req["prefill_pool"]
                counts[pool] = counts.get(pool, 0) + 1
        return counts

    def _pool_states(self, now: float) -> dict[str, PoolState]:
        return self.pools.states(now, self._in_flight(), self._failures)

    def _handle_dead_pools(self, pools: dict[str, PoolState], now: float) -> list[Send]:
        dead = dead_pools(tuple(pools.values()), now, self.config.heartbeat_timeout_s)
        if not dead:
            return []
        in_flight = []
        for rid, req in self.requests.items():
            if req["status"] != "dispatched":
                continue
            phase = Phase.DECODE if req.get("phase") == "decode" else Phase.PREFILL
            pool = req["decode_pool"] if phase is Phase.DECODE else req["prefill_pool"]
            kv_at = frozenset({"kvstore"}) if req.get("kv") else frozenset()
            in_flight.append(InFlightAttempt(rid, phase, max(0, req["attempt"] - 1), pool, req["attempt"], kv_at))
        for redo in redispatch_lost(in_flight, dead):
            req = self.requests[redo.request_id]
            self.reports.redispatched += 1
            self.requests[redo.request_id] = req = dict(req, status="pending", avoid=sorted(redo.avoid_pools))
            self._enqueue(redo.request_id, req, now)
        return []

    def _speculate(self, pools: dict[str, PoolState], now: float) -> list[Send]:
        running = []
        for rid, req in self.requests.items():
            if req["status"] != "dispatched" or req.get("speculated"):
                continue
            phase = Phase.DECODE if req.get("phase") == "decode" else Phase.PREFILL
            pool = req["decode_pool"] if phase is Phase.DECODE else req["prefill_pool"]
            state = pools.get(pool)
            running.append(RunningAttempt(rid, phase, max(0, req["attempt"] - 1), pool, req["model"], req["started_at"],
                                          req["prompt_tokens"] if phase is Phase.PREFILL else req["max_tokens"],
                                          max(1, min(state.in_flight, state.max_batch)) if state else 1, req["attempt"]))
        sends: list[Send] = []
        table = self.profiles.table()
        for copy in find_stragglers(running, table, tuple(pools.values()), now, self.config.retry):
            req = self.requests[copy.request_id]
            work = self._work(copy.request_id, dict(req, avoid=sorted(copy.avoid_pools)))
            sent = self._dispatch(copy.request_id, dict(req, status="pending"), work, pools, table, now)
            if sent:
                self.reports.speculative += 1
                self.requests[copy.request_id] = dict(self.requests[copy.request_id], speculated=True)
                sends += sent
        return sends

    def _work(self, rid: str, req: dict[str, Any]) -> RequestWork:
        return RequestWork(
            rid, req["job_id"], req["tenant"], req["model"], req["prompt_tokens"], req["max_tokens"],
            deadline=req["deadline_ms"] / 1000, quality_tier=QualityTier(req["quality_tier"].lower()),
            quality_tolerance=req.get("quality_tolerance") or 0.0, attempt=req["attempt"],
            avoid_pools=frozenset(req.get("avoid") or ()),
        )

    def _backlog(self) -> list[BacklogJob]:
        remaining: dict[str, list[int]] = {}
        for req in self.requests.values():
            if req["status"] in OPEN:
                acc = remaining.setdefault(req["job_id"], [0, 0])
                acc[0] += req["prompt_tokens"]
                acc[1] += req["max_tokens"]
        return [BacklogJob(j, self.jobs[j]["tenant"], self.jobs[j]["model"], self.jobs[j]["deadline_ms"] / 1000, p, d)
                for j, (p, d) in remaining.items() if j in self.jobs]

    def _job_entry(self, job: dict[str, Any]) -> dict[str, Any]:
        return {"job_id": job["job_id"], "tenant": job["tenant"], "priority": job["priority"], "model": job["model"],
                "deadline_ms": job["deadline"], "submitted_at_ms": job["submitted_at"], "state": "SUBMITTED",
                "requests_total": len(job.get("requests") or []), "done": 0, "failed": 0, "tokens_in": 0,
                "tokens_out": 0, "quality_tier": job["quality_tier"], "output_file": None, "lines_written": 0}

    def _reject(self, entry: dict[str, Any], reason: str, earliest: float | None, now: float) -> list[Send]:
        if earliest is not None:
            when = datetime.fromtimestamp(earliest, timezone.utc).isoformat(timespec="seconds")
            reason += f" (resubmit with a deadline at or after {when}, {earliest - now:.0f} s from now)"
        entry = dict(entry, state="REJECTED", finished_at=now)
        self.jobs[entry["job_id"]] = entry
        return records.job_event_sends(entry, "REJECTED", now, reason=reason, earliest_feasible_deadline=earliest)

    @staticmethod
    def _attempt_record(rid: str, h: dict[str, Any]) -> AttemptRecord:
        failed = h.get("failed")
        return AttemptRecord(rid, Phase(h["phase"]), h["attempt"], h["pool"],
                             AttemptStatus.FAILED if failed else AttemptStatus.SUCCEEDED, h["started_at"],
                             h.get("ended_at", h["started_at"]), FailureKind(failed) if failed else None, h.get("detail", ""))
