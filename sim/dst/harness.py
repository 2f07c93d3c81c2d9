"""Deterministic simulation testing of the control core (in the spirit of FoundationDB's
simulation and TigerBeetle's VOPR): the shipped ``ControlCore`` and ``JobTracker`` (``control.py``)
run against a fake fleet with faults injected, every input they get is logged, and invariants
are checked after every event.

Life of one run (all randomness from the scenario's seed):
1. jobs arrive (good ones, infeasible ones, malformed ones) as ``JobSubmitted``; admitted
   requests come back through a message bus as ``RequestQueued`` (the requests.pending hop);
2. every 0.25 s the core ticks; its ``Dispatch``es go to the fake fleet, whose answers
   (``KvReady``, ``AttemptFailed``, results) come back through the bus with seeded delays,
   duplicates and reorderings (results keep their order, as one Kafka partition does, but are
   replayed); the result sink (first line per request wins) sends ``OutputWritten`` receipts
   with the job's output tallies;
3. faults: pools lost and returning, pools slowed, attempts failing, KV lost, tenants cancelling
   (and strangers trying to), heartbeats every second, profile and path-quality updates;
4. control-plane restarts: the core and the tracker are rebuilt from their store (a JSON round
   trip of the records); the crash may lose the last call's sends or its table writes (with ``write_behind``,
   the store is written every ``FLUSH_S`` only: a crash loses what changed since), and the
   messages it had read but not committed are delivered again (those of the last ``REDELIVER_S``,
   which covers every message read since the last flush, as the live commit-after-flush does);
5. the drain: faults stop, every pool comes back, and the run goes on until every admitted job
   is final or the drain limit passes; then the end invariants.
A violation raises ``Violation`` with the event log (``self.log``) that led to it.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from phaseroute.schemas.enums import JobEventKind
from phaseroute.sim.dst import invariants
from phaseroute.sim.dst import scenario as sc
from phaseroute.sim.dst.control import DstControl
from phaseroute.sim.dst.fleet import FakeFleet
from phaseroute.sim.dst.invariants import Ledger, Violation
from phaseroute.sim.dst.store import JournalStore
from phaseroute.streams.core import (
    CancelRequested,
    ControlCore,
    Decision,
    Dispatch,
    FailRequest,
    FleetObserved,
    JobChanged,
    OutputWritten,
    ProfilesUpdated,
    QueueRequest,
    ResultReceived,
)
from phaseroute.streams.core.events import Event
from phaseroute.streams.policy import PathQuality, ProfileTable

TICK_S, HEARTBEAT_S, PROFILES_S = 0.25, 1.0, 30.0
FLUSH_S = 1.0  # write_behind: the store is written this often (the live control plane's FLUSH_EVERY_S)
REDELIVER_S = 2.0  # messages read this long before a crash were not committed: delivered again
assert REDELIVER_S > FLUSH_S + TICK_S, "a crash must be followed by every event read since the last flush"


@dataclass
class Restart:
    """A control-plane restart in the log: what the crash lost, and the new core's seed."""

    lost: str  # "nothing" | "sends" | "writes"
    seed: int


@dataclass
class Restored:
    """In the log: the restarted core rebuilds its state from the store here (after it was told
    the fleet and the profiles)."""


@dataclass
class Flushed:
    """In the log: a write-behind core writes what changed to its store here."""


LogEntry = tuple[float, Event | Restart | Restored | Flushed | None]  # None: a tick


@dataclass
class Outcome:
    seed: int
    requests: int
    admitted_jobs: int
    rejected: int
    restarts: int
    events: int
    dispatches: int
    sim_s: float
    counts: dict[str, int] = field(default_factory=dict)


class Harness:
    def __init__(self, s: sc.Scenario) -> None:
        self.s = s
        self.rng = random.Random(s.seed)
        self.config = sc.core_config(s, self.rng)
        self.pools = sc.fleet(s, self.rng)
        self.fleet = FakeFleet(self.pools, sc.MODEL, s.faults, random.Random(s.seed * 31 + 7))
        self.store = JournalStore()
        self.sut = DstControl(self.config, self.store, seed=s.seed, write_behind=s.write_behind)
        self.log: list[LogEntry] = []
        self.ledger = Ledger()
        self.timeline: list[tuple[float, int, str, Any]] = []
        self._seq = 0
        self.recent: deque[tuple[float, Event]] = deque()  # delivered to the core, maybe not committed
        self.pending: list[Decision] = []  # the last call's decisions, not sent yet (a crash may lose them)
        self.results_at = 0.0  # results reach the core in order: never before the previous one
        self.lines: dict[str, dict[str, int]] = {}  # job -> request -> lines the sink wrote
        self.tallies: dict[str, list[int]] = {}  # job -> [lines, ok, failed, tokens in, tokens out] of its output
        self.admitted: dict[str, int] = {}
        self.kinds: dict[str, str] = {}
        self.outcome = Outcome(s.seed, 0, 0, 0, 0, 0, 0, 0.0)
        self.now = 0.0
        self.flushed_at = 0.0

    @property
    def core(self) -> ControlCore:
        return self.sut.core

    # -- the timeline --------------------------------------------------------------------------
    def _at(self, t: float, kind: str, payload: Any = None) -> None:
        self._seq += 1
        heapq.heappush(self.timeline, (t, self._seq, kind, payload))

    def _deliver(self, event: Event, now: float, ordered: bool = False) -> None:
        """Through the bus to the core: delayed, sometimes twice; ``ordered`` keeps results in order."""
        t = now + self.rng.uniform(*self.s.delay_s)
        if ordered:
            t = self.results_at = max(t, self.results_at)
        self._at(t, "deliver", event)
        if self.rng.random() < self.s.duplicate:
            self.outcome.counts["duplicates"] = self.outcome.counts.get("duplicates", 0) + 1
            self._at(t + self.rng.uniform(0.0, 5.0), "deliver", event)

    # -- the core's inputs and outputs --------------------------------------------------------
    def _call(self, entry: Event | None, now: float) -> None:
        self._flush_pending(now)
        self.log.append((now, entry))
        self.store.mark()
        before = self.core.dispatch.fair.report()
        decisions, hops = self.sut.call(entry, now)
        self.outcome.events += 1
        if isinstance(entry, ResultReceived) and entry.request_id not in self.ledger.ended:
            self.ledger.ended[entry.request_id] = self.ledger.epoch
        invariants.after_event(self.core, decisions, self.ledger, now)
        if entry is None:
            invariants.fair_share(self.core, before)
        if entry is not None and not isinstance(entry, (FleetObserved, ProfilesUpdated)):
            self.recent.append((now, entry))
        self.recent.extend((now, hop) for hop in hops)
        self.pending = decisions

    def _flush_pending(self, now: float) -> None:
        decisions, self.pending = self.pending, []
        for d in decisions:
            self._act(d, now)

    def _act(self, d: Decision, now: float) -> None:
        if isinstance(d, QueueRequest):
            self._deliver(d.request, now)
        elif isinstance(d, Dispatch):
            self.outcome.dispatches += 1
            self.fleet.dispatch(d, now)
        elif isinstance(d, FailRequest):
            self._result(d.work.request_id, d.work.job_id, False, d.work.prompt_tokens, 0, now)
        elif isinstance(d, JobChanged):
            job_id = d.job["job_id"]
            if d.kind is JobEventKind.ADMITTED:
                self.admitted[job_id] = d.job["requests_total"]
            elif d.kind is JobEventKind.REJECTED:
                self.outcome.rejected += 1

    def _result(self, rid: str, job_id: str, ok: bool, tokens_in: int, tokens_out: int, now: float) -> None:
        """A result on the results topic: the sink writes its first line per request and sends a
        receipt; the core reads the same order (with replays)."""
        lines = self.lines.setdefault(job_id, {})
        if rid not in lines:
            lines[rid] = 1
            tally = self.tallies.setdefault(job_id, [0, 0, 0, 0, 0])
            tally[0] += 1
            tally[1 if ok else 2] += 1
            tally[3] += tokens_in if ok else 0
            tally[4] += tokens_out if ok else 0
            self._deliver(OutputWritten(job_id, *tally), now)
        self._deliver(ResultReceived(rid, job_id, ok, tokens_in, tokens_out), now, ordered=True)

    def _maybe_flush(self, now: float) -> None:
        """A write-behind core's store is written every ``FLUSH_S`` (and only then)."""
        if self.s.write_behind and now - self.flushed_at >= FLUSH_S:
            self.flushed_at = now
            self.log.append((now, Flushed()))
            self.store.mark()
            self.sut.flush()

    # -- faults of the control plane -----------------------------------------------------------
    def _restart(self, now: float) -> None:
        lost = self.rng.choice(("nothing", "sends", "writes"))
        if lost == "sends":
            self.pending = []
        else:
            self._flush_pending(now)
        if lost == "writes":
            self.store.rollback()
        seed = self.rng.randrange(2**31)
        self.log.append((now, Restart(lost, seed)))
        self.outcome.restarts += 1
        self.ledger.epoch += 1
        self.store = self.store.reloaded()
        self.sut = DstControl(self.config, self.store, seed=seed, write_behind=self.s.write_behind)
        self._call(FleetObserved(self.fleet.heartbeats(now)), now)
        self._call(ProfilesUpdated(self.table), now)
        self._flush_pending(now)
        self.log.append((now, Restored()))
        decisions = self.core.restore(now)
        invariants.after_event(self.core, decisions, self.ledger, now)
        self.pending = decisions
        for t, event in self.recent:  # read but not committed: Kafka delivers them again
            if t >= now - REDELIVER_S:
                self._at(now + self.rng.uniform(0.0, 1.0), "deliver", event)
        self.recent.clear()

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> Outcome:
        s, rng = self.s, self.rng
        self.table = sc.profile_table(self.pools, 0.0, rng)
        self._call(FleetObserved(self.fleet.heartbeats(0.0)), 0.0)
        self._call(ProfilesUpdated(self.table), 0.0)
        for at, job, kind in sc.jobs(s, rng):
            self.kinds[job.job_id] = kind
            self.outcome.requests += len(job.prompts)
            self._at(at, "deliver", job)
            if kind == "good" and rng.random() < s.cancel:
                self._at(at + rng.uniform(1.0, 300.0), "deliver", CancelRequested(job.job_id, job.tenant, "dst"))
            if rng.random() < s.stranger_cancel:
                self._at(at + rng.uniform(0.0, 60.0), "deliver", CancelRequested(job.job_id, "stranger", "dst"))
        self._at(TICK_S, "tick")
        self._at(HEARTBEAT_S, "heartbeat")
        self._at(PROFILES_S, "profiles")
        t = 0.0
        while t < s.arrivals_s:
            t += rng.expovariate(s.restart_per_s)
            if t < s.arrivals_s:
                self._at(t, "restart")
        drain_from = s.arrivals_s + s.deadline_s[1]
        self._at(drain_from, "drain")
        limit = drain_from + 3 * (self.config.retry.unplaced_give_up_s + (self.config.expire_after_deadline_s or 0.0))
        while self.timeline:
            t, _, kind, payload = heapq.heappop(self.timeline)
            if t > limit:
                break
            self.now = t
            self._advance_fleet(t)
            if kind == "deliver":
                self._call(payload, t)
            elif kind == "tick":
                self._call(None, t)
                self._maybe_flush(t)
                if self.core.more_to_release:  # the tick stopped at the release cap: it goes on at this instant
                    self._at(t, "tick")
                    continue
                self.fleet.maybe_fault(t, TICK_S)
                if not self._done():
                    self._at(t + TICK_S, "tick")
            elif kind == "heartbeat":
                self._call(FleetObserved(self.fleet.heartbeats(t)), t)
                self._at(t + HEARTBEAT_S, "heartbeat")
            elif kind == "profiles":
                self.table = self._refreshed_table(t)
                self._call(ProfilesUpdated(self.table), t)
                self._at(t + PROFILES_S, "profiles")
            elif kind == "restart":
                self._restart(t)
            elif kind == "drain":
                self.fleet.recover_all(t)
            if kind == "tick" and self._done():
                break
        self._flush_pending(self.now)
        self.outcome.sim_s = self.now
        self.outcome.counts.update(self.fleet.counts)
        r = self.core.reports
        self.outcome.counts.update(retries=r.retries, redispatched=r.redispatched, speculative=r.speculative,
                                   unplaced=r.unplaced)
        self.outcome.admitted_jobs = len(self.admitted)
        self._check_end()
        return self.outcome

    def _advance_fleet(self, t: float) -> None:
        self.fleet.advance(t)
        for when, message in self.fleet.out:
            if isinstance(message, tuple):  # ("result", dispatch)
                d = message[1]
                self._result(d.work.request_id, d.work.job_id, True, d.work.prompt_tokens, d.work.max_output_tokens,
                             when)
            else:
                self._deliver(message, when)
        self.fleet.out.clear()

    def _refreshed_table(self, now: float) -> ProfileTable:
        """Path qualities move (a path demoted, a demoted one recovering); rows age but stay."""
        table = self.table
        if table.quality and not self.fleet.calm:
            key = self.rng.choice(sorted(table.quality))
            q = table.quality[key]
            flipped = PathQuality(q.model, q.src, q.dst, 1.0 if q.score < 1 else 0.8, not q.exact_ok, q.samples, now)
            table = table.with_rows(quality=[flipped])
        return table

    def _done(self) -> bool:
        if not self.fleet.calm:
            return False
        for job_id, total in self.admitted.items():
            job = self.sut.tracker.jobs.get(job_id)
            if job is None or not job.state.is_finished or len(self.lines.get(job_id, {})) < total:
                return False
            if job.finished_requests < total or job.lines_written < total:
                return False
        return not self.core.dispatch.requests

    def _check_end(self) -> None:
        for job_id, kind in self.kinds.items():
            job = self.sut.tracker.jobs.get(job_id)
            if kind == "malformed" and job is not None and job.state.name != "REJECTED":
                raise Violation("bad_job_rejected", f"malformed job {job_id} is {job.state.name}")
        invariants.at_end(self.core, self.sut.tracker.jobs, self.admitted, self.lines)
