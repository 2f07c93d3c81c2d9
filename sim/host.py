"""What the ``Simulator`` mixins (``disruptions``, ``phase_ends``, ``sampling``, ``speculation``) use of it.

A typing-only view: each mixin method declares ``self: SimHost``, so mypy checks the mixins
against the simulator's state (engine.py) without a common base class at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import random

    from phaseroute.schemas.enums import JobState
    from phaseroute.sim.engine import PoolRun, SimConfig
    from phaseroute.sim.fleet import Fleet
    from phaseroute.sim.instance import Instance
    from phaseroute.sim.telemetry import Telemetry
    from phaseroute.sim.workload import Workload


class SimHost(Protocol):
    w: Workload
    fleet: Fleet
    driver: Any                      # a baseline (drivers.py) or CoreDriver; optional hooks are probed
    cfg: SimConfig
    pools: list[PoolRun]
    tel: Telemetry
    rng: random.Random
    now: float
    # one column per request row (speculative copies appended)
    prompt: list[int]
    output: list[int]
    job: list[int]
    ctx: list[float]
    status: list[int]
    attempt: list[int]
    pre_pool: list[int]
    dec_pool: list[int]
    colo: list[bool]
    where: list[Instance | None]
    t_done: list[float]
    t_phase: list[float]
    req_tenant: list[int]
    twin: dict[int, int]
    counters: dict[str, float]
    inflight: int
    unresolved_jobs: int
    tokens_done: float
    series: list[dict[str, Any]]
    sample_s: float
    last_sample: float
    last_sample_tokens: float
    tenant_waiting: list[int]
    tenant_released: list[float]
    tenant_mark: list[float]
    pool_end_t: list[float]
    links_busy: dict[tuple[str, str], float]
    inflight_tokens: int
    release_pending: bool
    self_released: bool
    lost_from: int
    unplaced: dict[int, int]
    unplaced_since: dict[int, float]
    job_left: list[int]
    job_done_t: list[float]
    job_state: list[JobState]
    job_reason: list[str]

    def push(self, t: float, kind: int, a: Any = None, b: Any = None) -> None: ...
    def _route(self, rid: int) -> None: ...
    def _schedule(self, inst: Instance) -> None: ...
    def _dispatch(self, pool: PoolRun) -> None: ...
    def _fill(self, pool: PoolRun, inst: Instance) -> int: ...
    # disruptions: lost and failed requests
    def _lost(self, rid: int, pool_idx: int, cause: str) -> None: ...
    def _give_up(self, rid: int, why: str) -> None: ...
    # disruptions
    def _kill(self, inst: Instance, cause: str) -> None: ...
    def _next_failure(self, pool: PoolRun, now: float) -> None: ...
    def _revive(self, pool: PoolRun, inst: Instance) -> None: ...
    def _lose_pool(self, pool: PoolRun) -> None: ...
    # speculation
    def _speculate(self) -> None: ...
    def _clone(self, rid: int, avoid: frozenset[str]) -> None: ...
    def twin_of(self, rid: int) -> int: ...
    def _cancel(self, rid: int) -> None: ...
    def _withdraw(self, inst: Instance, rid: int, status: int) -> None: ...
    def _twin_finished(self, rid: int) -> int: ...
