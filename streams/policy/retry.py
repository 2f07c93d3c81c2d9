"""Retries and stragglers: what to do about an attempt that failed or runs too long.

A failed attempt (worker error, KV checksum failure, worker death, ...) gets a :class:`Retry`
after an exponential backoff with jitter (from the caller's rng), placed away from every pool
that failed the request before, until ``max_attempts`` failures; then :class:`GiveUp` with the
attempt history in the reason. A KV checksum failure, or a decode whose KV was lost, goes
back to prefill. An attempt running longer than ``straggler_margin`` x its profile's p99
duration (+ ``straggler_grace_s``) gets a :class:`SpeculativeCopy` on another pool; the first
result wins (the tracker dedups results by request id and marks the loser SUPERSEDED).
A request that no pool could place (every pool refused it: lost, too small for its KV, the
wrong quality...) waits and is tried again; :func:`give_up_unplaced` ends that wait once it
has lasted ``unplaced_give_up_s`` and the request's deadline has passed, so a job stranded by a
pool that vanished still reaches a final state, with the router's reason in its output.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from . import _checks
from .confidence import ConfidenceConfig, effective_profile
from .cost_model import service_time
from .lifecycle import AttemptStatus, FailureKind, attempt_id
from .types import Phase, PoolState, ProfileRow, ProfileTable


@dataclass(frozen=True)
class RetryConfig:
    max_attempts: int = 4
    """Failed attempts (all phases) after which the request gives up."""
    base_backoff_s: float = 1.0
    """Delay before the first retry."""
    backoff_multiplier: float = 2.0
    """Each further retry waits this many times longer..."""
    max_backoff_s: float = 60.0
    """...up to this."""
    jitter_fraction: float = 0.2
    """The delay is scaled by a uniform factor in [1 - jitter, 1 + jitter]."""
    straggler_margin: float = 1.5
    """An attempt is a straggler past margin x its expected p99 duration..."""
    straggler_grace_s: float = 5.0
    """...plus this grace (covers queueing inside the worker)."""
    max_speculative_copies: int = 1
    """Extra running copies a request may have at once."""
    unplaced_give_up_s: float = 1800.0
    """A request no pool could place for this long (and past its deadline) fails."""
    confidence: ConfidenceConfig = field(default_factory=ConfidenceConfig)

    def __post_init__(self) -> None:
        owner = "RetryConfig"
        _checks.at_least(owner, "max_attempts", self.max_attempts, 1)
        _checks.non_negative(owner, "base_backoff_s", self.base_backoff_s)
        _checks.at_least(owner, "backoff_multiplier", self.backoff_multiplier, 1.0)
        _checks.non_negative(owner, "max_backoff_s", self.max_backoff_s)
        _checks.fraction(owner, "jitter_fraction", self.jitter_fraction)
        _checks.at_least(owner, "straggler_margin", self.straggler_margin, 1.0)
        _checks.non_negative(owner, "straggler_grace_s", self.straggler_grace_s)
        _checks.non_negative(owner, "max_speculative_copies", self.max_speculative_copies)
        _checks.non_negative(owner, "unplaced_give_up_s", self.unplaced_give_up_s)


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt as the tracker saw it."""

    request_id: str
    phase: Phase
    attempt: int
    pool: str
    status: AttemptStatus
    started_at: float
    ended_at: float | None = None
    failure: FailureKind | None = None
    detail: str = ""
    kv_lost: bool = False  # a decode attempt whose KV lived only where it failed


@dataclass(frozen=True)
class Retry:
    request_id: str
    phase: Phase
    attempt: int
    at: float  # not before this time
    avoid_pools: frozenset[str]
    reason: str

    @property
    def attempt_id(self) -> str:
        return attempt_id(self.request_id, self.phase, self.attempt)


@dataclass(frozen=True)
class GiveUp:
    request_id: str
    reason: str
    failures: int


def backoff_delay(failures: int, config: RetryConfig, rng: random.Random) -> float:
    """Delay before the retry that follows the ``failures``-th failure (1-based)."""
    base = min(config.max_backoff_s, config.base_backoff_s * config.backoff_multiplier ** max(failures - 1, 0))
    return base * (1.0 + config.jitter_fraction * (2.0 * rng.random() - 1.0))


def _summary(history: Sequence[AttemptRecord]) -> str:
    parts = []
    for r in sorted(history, key=lambda r: r.attempt):
        what = r.failure.value if r.failure else r.status.name.lower()
        parts.append(f"#{r.attempt} {r.phase.slug} on {r.pool}: {what}{f' ({r.detail})' if r.detail else ''}")
    return "; ".join(parts)


def give_up_unplaced(
    request_id: str, deadline: float | None, unplaced_since: float, now: float, why: str, config: RetryConfig
) -> GiveUp | None:
    """GiveUp for a request no pool has placed since ``unplaced_since`` once that wait reaches
    ``config.unplaced_give_up_s`` and its ``deadline`` (None: none) has passed; ``why`` is the
    router's last refusal, carried into the reason. None: keep waiting (the pool may come back)."""
    waited = now - unplaced_since
    if waited < config.unplaced_give_up_s or (deadline is not None and now < deadline):
        return None
    return GiveUp(request_id, f"no pool could place it for {waited:.0f} s and its deadline has passed: {why}", 0)


def next_step(history: Sequence[AttemptRecord], now: float, config: RetryConfig, rng: random.Random) -> Retry | GiveUp:
    """After the latest attempt of one request failed: retry it (when, where not, which phase) or give up."""
    if not history:
        raise ValueError("next_step: history must hold at least the failed attempt, got []")
    last = max(history, key=lambda r: r.attempt)
    if last.status is not AttemptStatus.FAILED:
        raise ValueError(
            f"next_step: latest attempt #{last.attempt} of {last.request_id} is {last.status.name}, not FAILED"
        )
    failed = [r for r in history if r.status is AttemptStatus.FAILED]
    if last.failure is not None and not last.failure.retryable:
        return GiveUp(last.request_id, f"not retryable ({last.failure.value}): {_summary(history)}", len(failed))
    if len(failed) >= config.max_attempts:
        reason = f"gave up after {len(failed)} failed attempts (limit {config.max_attempts}): {_summary(history)}"
        return GiveUp(last.request_id, reason, len(failed))
    back_to_prefill = last.failure is FailureKind.KV_CHECKSUM or last.kv_lost
    phase = Phase.PREFILL if back_to_prefill else last.phase
    cause = last.failure.value if last.failure else "failed"
    return Retry(
        request_id=last.request_id,
        phase=phase,
        attempt=last.attempt + 1,
        at=now + backoff_delay(len(failed), config, rng),
        avoid_pools=frozenset(r.pool for r in failed),
        reason=f"retry {len(failed)}/{config.max_attempts - 1} after {cause} on {last.pool}"
        + (" (KV lost: prefill again)" if back_to_prefill and last.phase is Phase.DECODE else ""),
    )


@dataclass(frozen=True)
class RunningAttempt:
    """An attempt still running, as the tracker sees it."""

    request_id: str
    phase: Phase
    attempt: int
    pool: str
    model: str
    started_at: float
    tokens: int  # prompt tokens (prefill) or max output tokens (decode)
    batch_size: int = 1
    attempts_started: int = 1  # attempts of this request ever started; a new one gets this number
    prefill_tokens: int = 0  # a colocated attempt (phase DECODE): the prompt it prefills first


@dataclass(frozen=True)
class SpeculativeCopy:
    request_id: str
    phase: Phase
    attempt: int
    avoid_pools: frozenset[str]
    reason: str


def straggler_threshold_s(row: ProfileRow, phase: Phase, tokens: int, batch_size: int, config: RetryConfig) -> float:
    """margin x expected p99 duration + grace; the p99 duration is steps x p99 step latency
    (one step for prefill, one per output token for decode) or the service time at the
    measured throughput, whichever is longer."""
    steps = 1 if phase is Phase.PREFILL else tokens
    expected = max(steps * row.step_p99_s, service_time(row, tokens, max(batch_size, 1)))
    return config.straggler_margin * expected + config.straggler_grace_s


def is_straggler(attempt: RunningAttempt, row: ProfileRow, now: float, config: RetryConfig) -> bool:
    threshold = straggler_threshold_s(row, attempt.phase, attempt.tokens, attempt.batch_size, config)
    return now - attempt.started_at > threshold


def straggler_limit_s(attempt: RunningAttempt, profiles: ProfileTable, variant: str, now: float,
                      config: RetryConfig) -> float | None:
    """How long ``attempt`` may run before it is a straggler, from its pool's effective profile
    (a colocated attempt adds its prefill's limit); None when no profile can judge it."""
    eff = effective_profile(profiles, attempt.model, attempt.phase, attempt.pool, variant, now, config.confidence)
    if eff is None:
        return None
    limit = straggler_threshold_s(eff.row, attempt.phase, attempt.tokens, attempt.batch_size, config)
    if attempt.prefill_tokens > 0:
        pre = effective_profile(profiles, attempt.model, Phase.PREFILL, attempt.pool, variant, now, config.confidence)
        if pre is None:
            return None
        limit += straggler_threshold_s(pre.row, Phase.PREFILL, attempt.prefill_tokens, 1, config)
    return limit


def find_stragglers(
    running: Iterable[RunningAttempt],
    profiles: ProfileTable,
    pools: Iterable[PoolState],
    now: float,
    config: RetryConfig,
) -> list[SpeculativeCopy]:
    """Speculative copies to start now: at most ``max_speculative_copies`` extra per request and phase."""
    variants = {p.name: p.variant for p in pools}
    groups: dict[tuple[str, Phase], list[RunningAttempt]] = defaultdict(list)
    for a in running:
        groups[(a.request_id, a.phase)].append(a)
    copies = []
    for (request_id, phase), attempts in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1].value)):
        if len(attempts) > config.max_speculative_copies:
            continue
        oldest = min(attempts, key=lambda a: a.started_at)
        limit = straggler_limit_s(oldest, profiles, variants.get(oldest.pool, ""), now, config)
        if limit is None or now - oldest.started_at <= limit:
            continue
        copies.append(
            SpeculativeCopy(
                request_id,
                phase,
                max(a.attempts_started for a in attempts),
                frozenset(a.pool for a in attempts),
                f"attempt #{oldest.attempt} on {oldest.pool} running {now - oldest.started_at:.1f} s > {limit:.1f} s",
            )
        )
    return copies
