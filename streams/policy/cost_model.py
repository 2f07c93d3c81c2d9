"""Seconds, bytes and dollars of one placement, from measured profiles and the pools' state now.

A request joins a batch on its pool: batch size = in-flight requests per worker + 1, capped
by the pool's max batch, and it gets ``1 / batch`` of the batch throughput measured at that
size (``tokens * batch / tokens_per_s(batch)``). Before that it waits behind the pool's queue
(queued tokens / (workers x throughput at full batch): queue depth x measured service time).
A disaggregated path adds the KV transfer (prompt tokens x KV bytes per token) over the
measured link and the decode pool's own queue; a colocated path queues once. Prefill on a
pool that also decodes stalls the decodes in flight there (``stall_s``, decode-seconds lost).

Dollars of a path: each phase's share of its pool's price for the seconds it holds a batch
slot, plus, when disaggregated, the KV bytes moved times the price of inter-pool traffic
(``RouterConfig.transfer_usd_per_gb``; 0 when moving KV costs nothing but time). The path has
no dollar figure (None) when either pool has no price.

The fleet's rate for a model (``fleet_rate``: the useful tokens/s of every alive, profiled pool
per phase) is what admission turns a job's tokens into seconds with.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from .confidence import ConfidenceConfig, effective_profile
from .types import LinkProfile, PathEstimate, Phase, PoolState, ProfileRow, ProfileTable, RequestWork


@dataclass(frozen=True, slots=True)
class PhaseOption:
    """A pool that passed the filters for one phase, with the effective row the estimate uses."""

    pool: PoolState
    phase: Phase
    row: ProfileRow
    confidence: float


def join_batch(pool: PoolState) -> int:
    """The batch size a new request joins on ``pool``."""
    per_worker = pool.in_flight // max(pool.workers, 1)
    return max(1, min(pool.max_batch, per_worker + 1))


def share_seconds(tokens: int, batch: int, batch_tokens_per_s: float) -> float:
    """Seconds for ``tokens`` of one request sharing a batch of ``batch`` that runs at
    ``batch_tokens_per_s`` in all."""
    return tokens * batch / batch_tokens_per_s


def service_time(row: ProfileRow, tokens: int, batch: int) -> float:
    """Seconds for ``tokens`` of one request sharing a batch of ``batch`` at the measured throughput."""
    return share_seconds(tokens, batch, row.tokens_per_s(batch))


def full_batch_capacity(pool: PoolState, row: ProfileRow) -> float:
    """Tokens per second of the whole pool at full batch: what drains its queue."""
    return pool.workers * row.tokens_per_s(pool.max_batch)


def pool_tokens_per_s(pool: PoolState, row: ProfileRow) -> float:
    """Useful throughput of the whole pool at full batch (failed work does not count)."""
    return full_batch_capacity(pool, row) * (1.0 - row.error_rate)


def price_per_worker_s(pool: PoolState) -> float | None:
    """Dollars per worker-second on ``pool``, None when it has no price."""
    price = pool.price_per_hour
    return None if price is None else price / 3600.0 / max(pool.workers, 1)


def free_kv_for_one(pool: PoolState) -> float:
    """KV memory one request can use on ``pool``: the roomiest worker's when known, else the pool's."""
    return pool.free_kv_bytes if pool.worker_free_kv_bytes is None else pool.worker_free_kv_bytes


def kv_need_bytes(request: RequestWork, row: ProfileRow, phase: Phase) -> float:
    """KV memory the request holds on a pool: the prompt for prefill, prompt + output for decode."""
    tokens = request.prompt_tokens if phase is Phase.PREFILL else request.total_tokens
    return tokens * row.kv_bytes_per_token


def transfer_time(link: LinkProfile, nbytes: float) -> float:
    return link.latency_s + nbytes / link.bytes_per_s


class PhaseCost(NamedTuple):
    """One phase of one request on one pool: computed once per decision and shared by every
    path through that pool (so a decision over P prefill and D decode pools costs P + D of
    these, and each of the P x D paths only adds them up). A named tuple: it is built for
    every pool of every request."""

    option: PhaseOption
    wait_s: float  # behind the pool's queue
    service_s: float  # the request's share of its batch
    dollars: float | None  # None when the pool has no price
    headroom: float  # KV memory headroom after the request's need, in [0, 1]

    @property
    def seconds(self) -> float:
        return self.wait_s + self.service_s


class CostInputs(NamedTuple):
    """What a phase cost reads from the pool and row but not from the request (``cost_inputs``)."""

    batch: int  # the batch a new request joins (``join_batch``)
    batch_tokens_per_s: float  # the row's throughput at that batch
    capacity: float  # ``full_batch_capacity``: what drains the queue
    per_worker_s: float | None  # ``price_per_worker_s``
    free_for_one: float  # ``free_kv_for_one``


def cost_inputs(pool: PoolState, row: ProfileRow) -> CostInputs:
    """The request-independent inputs of ``cost_from`` for ``row`` on ``pool``."""
    batch = join_batch(pool)
    return CostInputs(batch, row.tokens_per_s(batch), full_batch_capacity(pool, row), price_per_worker_s(pool),
                      free_kv_for_one(pool))


def cost_from(request: RequestWork, option: PhaseOption, inputs: CostInputs) -> PhaseCost:
    """Queue wait, service seconds, dollars and memory headroom of the request's phase on the
    option's pool, from the pool's request-independent ``inputs`` (``cost_inputs``; the router
    keeps them per pool state, ``phase_view``). Queued requests of unknown size count as the
    size of this one; the headroom is 1 - need / free clamped to [0, 1]."""
    pool = option.pool
    prefill = option.phase is Phase.PREFILL
    tokens = request.prompt_tokens if prefill else request.max_output_tokens
    batch = inputs.batch
    service_s = share_seconds(tokens, batch, inputs.batch_tokens_per_s)
    queue_tokens, queue_requests = pool.queue_tokens, pool.queue_requests
    if queue_tokens <= 0 and queue_requests <= 0:
        wait_s = 0.0
    else:
        queued = queue_tokens if queue_tokens > 0 else queue_requests * tokens
        wait_s = math.inf if inputs.capacity <= 0 else queued / inputs.capacity
    per_worker_s = inputs.per_worker_s
    need, free = kv_need_bytes(request, option.row, option.phase), inputs.free_for_one
    if need <= 0:
        headroom = 1.0
    elif free <= 0:
        headroom = 0.0
    else:  # min(1.0, max(0.0, h)) as comparisons: max keeps 0.0 unless h > 0.0, min keeps 1.0 unless h < 1.0
        headroom = 1.0 - need / free
        headroom = headroom if headroom > 0.0 else 0.0
        headroom = headroom if headroom < 1.0 else 1.0
    dollars = None if per_worker_s is None else per_worker_s * service_s / batch
    return PhaseCost(option, wait_s, service_s, dollars, headroom)


def phase_cost(request: RequestWork, option: PhaseOption) -> PhaseCost:
    """``cost_from`` with the inputs computed now (the router keeps them per pool state instead)."""
    return cost_from(request, option, cost_inputs(option.pool, option.row))


def transfer_dollars(kv_bytes: float, usd_per_gb: float) -> float:
    """What moving ``kv_bytes`` between two pools costs at ``usd_per_gb``."""
    return kv_bytes / 1e9 * usd_per_gb


PrefillSide = tuple[str, PoolState, float, float, float, "float | None", float, float, float, float]
DecodeSide = tuple[str, PoolState, float, float, "float | None", float, float, float]


def prefill_side(c: PhaseCost, prompt_tokens: int) -> PrefillSide:
    """(name, pool, KV bytes, wait, service, dollars, headroom, quality, 1 - error rate,
    decode-seconds stalled) of a prefill phase cost: what a path takes from its prefill side
    (a tuple, built once per pool and read by every path through it)."""
    pool, row = c.option.pool, c.option.row
    stall = c.service_s * pool.in_flight if Phase.DECODE in pool.phases else 0.0
    return (pool.name, pool, prompt_tokens * row.kv_bytes_per_token, c.wait_s, c.service_s, c.dollars,
            c.headroom, row.quality_score, 1.0 - row.error_rate, stall)


def decode_side(c: PhaseCost) -> DecodeSide:
    """(name, pool, wait, service, dollars, headroom, quality, 1 - error rate) of a decode phase cost."""
    pool, row = c.option.pool, c.option.row
    return (pool.name, pool, c.wait_s, c.service_s, c.dollars, c.headroom, row.quality_score, 1.0 - row.error_rate)


_new_estimate = tuple.__new__  # PathEstimate(...) without its Python-level __new__


def path_estimate(pre: PrefillSide, dec: DecodeSide, link: LinkProfile | None,
                  transfer_usd_per_gb: float = 0.0) -> PathEstimate:
    """The estimate of prefill on ``pre``'s pool and decode on ``dec``'s: a colocated path
    queues once and moves no KV; a disaggregated one adds the transfer over ``link`` and the
    decode pool's queue, and its dollars add the KV moved at ``transfer_usd_per_gb``. ``link``
    is ignored (and may be None) when the path is colocated."""
    src, _, kv_bytes, prefill_wait, prefill_s, cost_p, head_p, q_p, ok_p, stall = pre
    dst, _, decode_wait, decode_s, cost_d, head_d, q_d, ok_d = dec
    if src == dst:
        transfer_s, decode_wait, headroom, moved_bytes, moved = 0.0, 0.0, head_d, 0.0, 0.0
    else:
        if link is None:
            raise ValueError(f"estimate_path: a link profile is needed for {src} -> {dst}")
        transfer_s = transfer_time(link, kv_bytes)
        headroom, moved_bytes = head_p if head_p < head_d else head_d, kv_bytes  # min(head_d, head_p)
        moved = transfer_dollars(kv_bytes, transfer_usd_per_gb)
    return _new_estimate(PathEstimate, (
        src, dst, prefill_wait, prefill_s, transfer_s, decode_wait, decode_s, moved_bytes,
        None if cost_p is None or cost_d is None else cost_p + cost_d + moved,
        q_p * q_d, ok_p * ok_d, headroom, stall,
    ))


def combine(
    request: RequestWork,
    prefill: PhaseCost,
    decode: PhaseCost,
    link: LinkProfile | None,
    transfer_usd_per_gb: float = 0.0,
) -> PathEstimate:
    """``path_estimate`` of the two phase costs of ``request``."""
    return path_estimate(prefill_side(prefill, request.prompt_tokens), decode_side(decode), link, transfer_usd_per_gb)


def estimate_path(
    request: RequestWork,
    prefill: PhaseOption,
    decode: PhaseOption,
    link: LinkProfile | None,
    transfer_usd_per_gb: float = 0.0,
) -> PathEstimate:
    """Estimate one placement; ``link`` is ignored (and may be None) when the path is colocated."""
    return combine(request, phase_cost(request, prefill), phase_cost(request, decode), link, transfer_usd_per_gb)


def fleet_tokens_per_s(
    model: str,
    phase: Phase,
    pools: Iterable[PoolState],
    profiles: ProfileTable,
    now: float,
    config: ConfidenceConfig,
) -> float:
    """Useful throughput of every alive pool that serves ``phase`` with ``model`` loaded."""
    total = 0.0
    for pool in pools:
        if not (pool.alive and pool.serves(phase) and model in pool.models):
            continue
        eff = effective_profile(profiles, model, phase, pool.name, pool.variant, now, config)
        if eff is not None:
            total += pool_tokens_per_s(pool, eff.row)
    return total


@dataclass(frozen=True, slots=True)
class FleetRate:
    """The fleet's useful tokens per second for one model: what admission converts work into seconds with."""

    prefill_tokens_per_s: float
    decode_tokens_per_s: float


def fleet_rate(model: str, pools: Iterable[PoolState], profiles: ProfileTable, now: float,
               config: ConfidenceConfig) -> FleetRate:
    """Every alive, profiled pool's useful throughput for ``model``, per phase."""
    pools = list(pools)
    return FleetRate(fleet_tokens_per_s(model, Phase.PREFILL, pools, profiles, now, config),
                     fleet_tokens_per_s(model, Phase.DECODE, pools, profiles, now, config))
