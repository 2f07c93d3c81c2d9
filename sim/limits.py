"""Physical limits every policy and the bound share: context length, KV of one instance, model placement.

A request of prompt L and output O can run only where all of these hold:

- context: ``L + O <= context_tokens`` of the model (admission rejects longer ones, and no
  engine could run them);
- placement: some alive pool holds the request's model and runs the phase;
- KV: one instance of that pool holds the phase's KV: the prompt for prefill, prompt + output
  for decode (colocated: both on the one instance).

A request is *feasible* on a set of pools when some pool can prefill it and some pool can
decode it (any prefill pool and any decode pool of the same model form a placement: two
different pools disaggregate, one pool that runs both phases colocates). A job with an
infeasible request can meet its deadline under no policy: every driver rejects it at
submission (``drivers.Driver.submit``; phaseroute's admission does the same with its own
checks), the metrics count it in ``jobs_infeasible``, and the LP bound leaves it out
(``bound_model``). The bound and the baselines call the same functions here, so the limits
cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from phaseroute.schemas.enums import Phase
from phaseroute.sim.fleet import Fleet, SimPool

if TYPE_CHECKING:
    from phaseroute.sim.workload import Workload


@dataclass(frozen=True)
class PoolLimits:
    """What bounds a request on one pool (an instance is one model copy)."""

    name: str
    model: str
    phases: tuple[Phase, ...]
    kv_per_token: float
    kv_capacity: float      # bytes of KV one instance holds
    context_tokens: int

    def __post_init__(self) -> None:
        check_phases(self.name, self.phases)

    @classmethod
    def of(cls, pool: SimPool) -> PoolLimits:
        return cls(pool.name, pool.model, pool.phases, pool.perf.kv_per_token, pool.perf.kv_capacity,
                   pool.context_tokens)

    def holds(self, prompt: int, output: int, phase: Phase) -> bool:
        """Whether one instance can run ``phase`` of a request of this size (model not checked)."""
        if phase not in self.phases or prompt + output > self.context_tokens:
            return False
        held = prompt if phase is Phase.PREFILL else prompt + output
        return held * self.kv_per_token <= self.kv_capacity


def check_phases(pool: str, phases: tuple[Phase, ...]) -> None:
    """A pool's phases are ``Phase`` members (a bare string would silently match no phase)."""
    if not all(isinstance(p, Phase) for p in phases):
        raise TypeError(f"pool {pool!r}: phases must be Phase members, got {phases!r}")


def fit_matrix(pools: Sequence[PoolLimits], prompt: np.ndarray, output: np.ndarray, models: Sequence[str],
               phase: Phase) -> np.ndarray:
    """bool[pool, request]: one instance of the pool can run ``phase`` of the request (its model
    ``models[r]``)."""
    L = np.asarray(prompt, dtype=np.float64)
    O = np.asarray(output, dtype=np.float64)  # noqa: E741
    held = L if phase is Phase.PREFILL else L + O
    model_arr = np.asarray(models)
    rows = []
    for p in pools:
        ok = (model_arr == p.model) & (L + O <= p.context_tokens) & (held * p.kv_per_token <= p.kv_capacity)
        rows.append(ok & (phase in p.phases))
    return np.stack(rows) if rows else np.zeros((0, len(L)), dtype=bool)


def feasible_requests(pools: Sequence[PoolLimits], prompt: np.ndarray, output: np.ndarray,
                      models: Sequence[str]) -> np.ndarray:
    """bool[request]: some pool prefills it and some pool decodes it."""
    if not pools:
        return np.zeros(len(prompt), dtype=bool)
    pre = fit_matrix(pools, prompt, output, models, Phase.PREFILL).any(axis=0)
    dec = fit_matrix(pools, prompt, output, models, Phase.DECODE).any(axis=0)
    return np.asarray(pre & dec, dtype=bool)


def infeasible_jobs(fleet: Fleet, w: Workload) -> np.ndarray:
    """bool[job]: the job has a request no pool of the fleet (as specified, before any event)
    can serve, so no policy can meet it."""
    models = [w.tenants[t].model for t in w.job_tenant[w.req_job]] if w.n_requests else []
    ok = feasible_requests([PoolLimits.of(p) for p in fleet.pools], w.req_prompt, w.req_output, models)
    bad = np.zeros(w.n_jobs, dtype=bool)
    np.logical_or.at(bad, w.req_job, ~ok)
    return bad


def why_infeasible(pools: Sequence[PoolLimits], prompt: int, output: int, model: str) -> str | None:
    """None when some pool prefills and some pool decodes the request; else the reason, naming
    the request's size and the largest limit it ran into."""
    mine = [p for p in pools if p.model == model]
    if not mine:
        return f"no pool holds model {model!r}"
    context = max(p.context_tokens for p in mine)
    if prompt + output > context:
        return f"prompt {prompt} + output {output} tokens > context {context} of {model!r}"
    for phase in (Phase.PREFILL, Phase.DECODE):
        if not any(p.holds(prompt, output, phase) for p in mine):
            held = prompt if phase is Phase.PREFILL else prompt + output
            room = max((p.kv_capacity / p.kv_per_token for p in mine if phase in p.phases), default=0.0)
            return (f"{phase.slug} needs KV for {held} tokens on one instance; the largest {phase.slug} instance of "
                    f"{model!r} holds {int(room)}")
    return None
