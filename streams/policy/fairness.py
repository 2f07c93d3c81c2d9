"""Fair release of admitted requests to the router: weighted virtual token counters (VTC).

A request's life here: ``enqueue`` puts it in its tenant's queue (earliest deadline first
within the tenant); ``schedule(free, now)`` releases requests in bounded *units* to the
tenants in VTC order, only up to the capacity the caller says is free (backpressure); the
caller routes each release and calls ``on_finished`` when the request is done (success or
give-up), which frees the tenant's in-flight slot and corrects the charge to the tokens
actually generated; a release that did not run (no pool could place it) is given back whole
with ``unrelease``. A released request enqueued again (a retry, work of a lost pool) gives its
slot back first and keeps what it was charged: the fleet did that work.

A tenant may also have a token share cap (``tenant_max_token_share``: the drift monitor's
canaries): it is released work only while its tokens stay within that share of all tokens
released in the last ``share_window_s`` (``share_window.py``), unless nobody else's work is
queued or running. Weights bound a tenant's share while others wait in the queues; the cap also
holds while they run, so a job released whole at once does not share its batches with more.

The state survives a restart of its owner: ``state()`` is each tenant's counter and served
cost (the control plane keeps it in a changelog-backed table); ``restore`` puts it back and
``resume`` re-registers the requests still running, so a flooding tenant neither gets a fresh
start nor a second set of in-flight slots.

VTC (Sheng et al., OSDI'24): each tenant has a counter of the service it received, divided
by its weight; the backlogged tenant with the smallest counter is served next, and a tenant
that becomes backlogged is lifted to the smallest counter of the backlogged ones (or to the
last such minimum when nobody is backlogged), so idling earns no credit. Service cost =
``input_weight * prompt + output_weight * output`` tokens, charged at release with the
expected output and corrected at finish. Deadline urgency may serve a tenant out of VTC
order only while its counter is at most ``urgency_bound`` above the minimum. Hence, between
two eligible backlogged tenants, counters never differ by more than :meth:`FairScheduler.fairness_bound`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from . import _checks
from .share_window import ShareWindow
from .types import RequestWork


@dataclass(frozen=True)
class FairConfig:
    input_weight: float = 1.0
    """Cost of one prompt token."""
    output_weight: float = 2.0
    """Cost of one output token (VTC's default: decode tokens cost twice a prompt token)."""
    expected_output_fraction: float = 1.0
    """Output charged at release, as a fraction of max_output_tokens (corrected at finish)."""
    max_unit_cost: float = 65_536.0
    """A release unit (consecutive requests of one tenant) costs at most this (a single larger request goes alone)."""
    max_unit_requests: int = 64
    """A release unit holds at most this many requests."""
    default_weight: float = 1.0
    """Weight of a tenant not named in ``tenant_weights``."""
    tenant_weights: Mapping[str, float] = field(default_factory=dict)
    default_max_in_flight: int = 512
    """Released-but-unfinished requests a tenant may have (unless named in ``tenant_max_in_flight``)."""
    tenant_max_in_flight: Mapping[str, int] = field(default_factory=dict)
    tenant_max_token_share: Mapping[str, float] = field(default_factory=dict)
    """A tenant named here is released at most this share of the tokens (prompt + expected
    output) released to all tenants in the last ``share_window_s``, while any other tenant has
    work queued or running, whatever its weight; with nobody else's work in the fleet it takes
    what is free. Weights order the waiting; this bounds a tenant's share of the running work."""
    share_window_s: float = 60.0
    """The window of ``tenant_max_token_share``."""
    urgency_slack_s: float = 300.0
    """A tenant whose head job has less slack than this (deadline - now - remaining work) is urgent."""
    urgency_bound: float = 100_000.0
    """U: an urgent tenant is served ahead only while its counter <= the minimum counter + U."""

    def __post_init__(self) -> None:
        owner = "FairConfig"
        _checks.non_negative(owner, "input_weight", self.input_weight)
        _checks.non_negative(owner, "output_weight", self.output_weight)
        _checks.fraction(owner, "expected_output_fraction", self.expected_output_fraction)
        _checks.positive(owner, "max_unit_cost", self.max_unit_cost)
        _checks.at_least(owner, "max_unit_requests", self.max_unit_requests, 1)
        _checks.positive(owner, "default_weight", self.default_weight)
        _checks.positive_mapping(owner, "tenant_weights", self.tenant_weights)
        _checks.at_least(owner, "default_max_in_flight", self.default_max_in_flight, 1)
        for tenant, cap in self.tenant_max_in_flight.items():
            _checks.at_least(owner, f"tenant_max_in_flight[{tenant!r}]", cap, 1)
        for tenant, share in self.tenant_max_token_share.items():
            _checks.finite(owner, f"tenant_max_token_share[{tenant!r}]", share)
            if not 0.0 < share < 1.0:
                raise ValueError(f"{owner}.tenant_max_token_share[{tenant!r}] must be in (0, 1), got {share!r}")
        _checks.positive(owner, "share_window_s", self.share_window_s)
        _checks.non_negative(owner, "urgency_slack_s", self.urgency_slack_s)
        _checks.non_negative(owner, "urgency_bound", self.urgency_bound)

    def weight(self, tenant: str) -> float:
        return self.tenant_weights.get(tenant, self.default_weight)

    def max_in_flight(self, tenant: str) -> int:
        return self.tenant_max_in_flight.get(tenant, self.default_max_in_flight)

    def cost(self, prompt_tokens: float, output_tokens: float) -> float:
        return self.input_weight * prompt_tokens + self.output_weight * output_tokens


@dataclass(frozen=True)
class FreeCapacity:
    """What the fleet can take now: requests, and optionally cost units (inf = unlimited)."""

    requests: int
    cost: float = math.inf


@dataclass(frozen=True)
class Release:
    request: RequestWork
    unit: int  # index of the release unit within this schedule() call
    cost: float  # charged cost (expected output)
    urgent: bool  # served ahead of VTC order by deadline urgency


@dataclass(frozen=True)
class TenantReport:
    tenant: str
    weight: float
    counter: float
    served_cost: float
    queued_requests: int
    queued_cost: float
    in_flight: int
    max_in_flight: int


@dataclass(frozen=True)
class SchedulerOutput:
    releases: tuple[Release, ...]
    counters: Mapping[str, float]
    stop_reason: str


@dataclass
class _Tenant:
    queue: list[tuple[float, int, RequestWork]] = field(default_factory=list)  # (deadline, seq, request)
    counter: float = 0.0
    served_cost: float = 0.0
    queued_cost: float = 0.0
    in_flight: int = 0


class FairScheduler:
    """Per-tenant queues released in VTC order; see the module docstring. Not thread-safe."""

    def __init__(self, config: FairConfig | None = None) -> None:
        self.config = config or FairConfig()
        self._tenants: dict[str, _Tenant] = {}
        self._job_cost: dict[str, float] = {}
        self._running: dict[str, tuple[str, float, float]] = {}  # request id -> (tenant, charged output tokens, charge)
        self._floor = 0.0  # last minimum counter among backlogged tenants
        self._largest_cost = 0.0
        self._seq = 0
        self._window = ShareWindow()  # tokens released in the last share_window_s, per tenant

    def _tenant(self, tenant: str) -> _Tenant:
        """The tenant's state, created empty on first sight (not built per call to find it)."""
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant()
        return state

    # --- input -------------------------------------------------------------------------
    def enqueue(self, request: RequestWork, now: float) -> None:
        if request.request_id in self._running:  # released before and back (retry, lost pool): free its slot
            self.on_finished(request.request_id, now)
        state = self._tenant(request.tenant)
        if not state.queue:
            backlogged = [t.counter for t in self._tenants.values() if t.queue]
            state.counter = max(state.counter, min(backlogged) if backlogged else self._floor)
        cost = self._charge(request)
        deadline = request.deadline if request.deadline is not None else math.inf
        heapq.heappush(state.queue, (deadline, self._seq, request))
        self._seq += 1
        state.queued_cost += cost
        self._job_cost[request.job_id] = self._job_cost.get(request.job_id, 0.0) + cost
        self._largest_cost = max(self._largest_cost, cost)

    def on_finished(self, request_id: str, now: float, output_tokens: int | None = None) -> bool:
        """Free the request's in-flight slot; correct the charge to ``output_tokens`` when given.
        Returns False for an unknown (or already finished) request, so replays are harmless."""
        entry = self._running.pop(request_id, None)
        if entry is None:
            return False
        tenant, charged_output, _ = entry
        state = self._tenants[tenant]
        state.in_flight -= 1
        if output_tokens is not None:
            delta = self.config.output_weight * (output_tokens - charged_output)
            state.served_cost += delta
            state.counter += delta / self.config.weight(tenant)
        return True

    def unrelease(self, request_id: str) -> bool:
        """A released request that did not run (no pool could place it, or it ended meanwhile):
        its tenant gets the in-flight slot and the whole charge back. False for an unknown request."""
        entry = self._running.pop(request_id, None)
        if entry is None:
            return False
        tenant, _, charge = entry
        self._window.remove(request_id)
        state = self._tenants[tenant]
        state.in_flight -= 1
        state.served_cost -= charge
        state.counter -= charge / self.config.weight(tenant)
        return True

    def cancel_job(self, job_id: str) -> list[RequestWork]:
        """Drop the job's queued requests (released ones finish or are cancelled downstream)."""
        removed: list[RequestWork] = []
        for state in self._tenants.values():
            keep = [item for item in state.queue if item[2].job_id != job_id]
            if len(keep) != len(state.queue):
                removed += [item[2] for item in state.queue if item[2].job_id == job_id]
                state.queue = keep
                heapq.heapify(state.queue)
                state.queued_cost = sum(self._charge(item[2]) for item in keep)
        self._job_cost.pop(job_id, None)
        return removed

    # --- restart -----------------------------------------------------------------------
    def state(self) -> dict[str, tuple[float, float]]:
        """What must survive a restart: tenant -> (counter, served cost)."""
        return {t: (s.counter, s.served_cost) for t, s in sorted(self._tenants.items())}

    def restore(self, saved: Mapping[str, tuple[float, float]]) -> None:
        """Put back each tenant's counter and served cost from :meth:`state` (before any enqueue)."""
        for tenant, (counter, served_cost) in saved.items():
            if not (math.isfinite(counter) and math.isfinite(served_cost)):
                raise ValueError(f"tenant {tenant!r}: saved counter {counter!r} / served cost {served_cost!r} must be finite")
            state = self._tenant(tenant)
            state.counter, state.served_cost = counter, served_cost
        if saved:
            self._floor = max(self._floor, min(counter for counter, _ in saved.values()))

    def resume(self, request: RequestWork) -> None:
        """A request released before the restart and still running holds its tenant's in-flight
        slot again; it was charged then (kept in the restored counter) and is corrected at finish."""
        if request.request_id in self._running:
            return
        self._tenant(request.tenant).in_flight += 1
        self._running[request.request_id] = (request.tenant, self._expected_output(request), self._charge(request))

    # --- decision ----------------------------------------------------------------------
    def schedule(self, free: FreeCapacity, now: float, fleet_cost_per_s: float | None = None) -> SchedulerOutput:
        """Release units in VTC order until ``free`` is used or nobody is eligible.
        ``fleet_cost_per_s`` (measured fleet throughput in cost units) sharpens deadline slack."""
        releases: list[Release] = []
        requests_left, cost_left, unit = free.requests, free.cost, 0
        self._window.expire(now - self.config.share_window_s)
        stop = "free request capacity used"
        while requests_left > 0:
            eligible = [t for t, s in self._tenants.items() if s.queue and s.in_flight < self.config.max_in_flight(t)
                        and self._tokens(s.queue[0][2]) <= self._share_room(t)]
            if not eligible:
                stop = "no eligible tenant (queues empty, at their in-flight cap or at their token share)"
                break
            tenant, urgent = self._pick(eligible, now, fleet_cost_per_s)
            taken = self._take_unit(tenant, requests_left, cost_left, now)
            if not taken:
                head = self._tenants[tenant].queue[0][2]
                cost = self._charge(head)
                stop = f"head request {head.request_id} of {tenant!r} costs {cost:.0f} > free cost {cost_left:.0f}"
                break
            for request, cost in taken:
                releases.append(Release(request, unit, cost, urgent))
                requests_left -= 1
                cost_left -= cost
            unit += 1
        return SchedulerOutput(tuple(releases), self.counters(), stop)

    def _expected_output(self, request: RequestWork) -> float:
        return self.config.expected_output_fraction * request.max_output_tokens

    def _charge(self, request: RequestWork) -> float:
        return self.config.cost(request.prompt_tokens, self._expected_output(request))

    def _tokens(self, request: RequestWork) -> float:
        return request.prompt_tokens + self._expected_output(request)

    def _share_room(self, tenant: str) -> float:
        """Tokens the tenant's share cap lets it be released now (inf: no cap, or nobody else's
        work is queued or running)."""
        share = self.config.tenant_max_token_share.get(tenant)
        if share is None:
            return math.inf
        if not any((s.queue or s.in_flight) for t, s in self._tenants.items() if t != tenant):
            return math.inf
        return self._window.room(tenant, share)

    def _slack(self, tenant: str, now: float, fleet_cost_per_s: float | None) -> float:
        head = self._tenants[tenant].queue[0][2]
        if head.deadline is None:
            return math.inf
        remaining = self._job_cost.get(head.job_id, 0.0) / fleet_cost_per_s if fleet_cost_per_s else 0.0
        return head.deadline - now - remaining

    def _pick(self, eligible: list[str], now: float, fleet_cost_per_s: float | None) -> tuple[str, bool]:
        lowest = min(eligible, key=lambda t: (self._tenants[t].counter, t))
        floor = self._tenants[lowest].counter
        self._floor = floor
        urgent = []
        for t in eligible:
            slack = self._slack(t, now, fleet_cost_per_s)
            if slack < self.config.urgency_slack_s and self._tenants[t].counter <= floor + self.config.urgency_bound:
                urgent.append((slack, self._tenants[t].counter, t))
        if urgent:
            chosen = min(urgent)[2]
            return chosen, chosen != lowest
        return lowest, False

    def _take_unit(self, tenant: str, requests_left: int, cost_left: float, now: float) -> list[tuple[RequestWork, float]]:
        state, weight = self._tenants[tenant], self.config.weight(tenant)
        room = min(requests_left, self.config.max_in_flight(tenant) - state.in_flight, self.config.max_unit_requests)
        token_room = self._share_room(tenant)
        taken: list[tuple[RequestWork, float]] = []
        total = 0.0
        while state.queue and len(taken) < room:
            request = state.queue[0][2]
            cost, tokens = self._charge(request), self._tokens(request)
            if total + cost > cost_left or (taken and total + cost > self.config.max_unit_cost) or tokens > token_room:
                break
            token_room -= tokens
            self._window.add(request.request_id, tenant, tokens, now)
            heapq.heappop(state.queue)
            taken.append((request, cost))
            total += cost
            state.queued_cost -= cost
            state.served_cost += cost
            state.counter += cost / weight
            state.in_flight += 1
            left = self._job_cost.get(request.job_id, 0.0) - cost
            if left > 1e-9:
                self._job_cost[request.job_id] = left
            else:
                self._job_cost.pop(request.job_id, None)
            self._running[request.request_id] = (tenant, self._expected_output(request), cost)
        return taken

    # --- reporting ---------------------------------------------------------------------
    def counters(self) -> dict[str, float]:
        return {t: s.counter for t, s in sorted(self._tenants.items())}

    def queued_requests(self) -> int:
        """Requests waiting in every tenant's queue (O(tenants))."""
        return sum(len(s.queue) for s in self._tenants.values())

    def report(self) -> tuple[TenantReport, ...]:
        return tuple(
            TenantReport(
                t,
                self.config.weight(t),
                s.counter,
                s.served_cost,
                len(s.queue),
                s.queued_cost,
                s.in_flight,
                self.config.max_in_flight(t),
            )
            for t, s in sorted(self._tenants.items())
        )

    def fairness_bound(self) -> float:
        """Largest counter gap between two eligible backlogged tenants: U + the largest unit
        charge (max_unit_cost, or one larger request) divided by the smallest weight."""
        weights = [self.config.weight(t) for t in self._tenants] or [self.config.default_weight]
        return self.config.urgency_bound + max(self.config.max_unit_cost, self._largest_cost) / min(weights)
