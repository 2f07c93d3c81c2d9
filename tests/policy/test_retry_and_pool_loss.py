"""Retries (backoff, limit, avoid list, phase), stragglers, and re-dispatch after pool loss."""

from __future__ import annotations

import random

import pytest

from phaseroute.streams.policy import (
    AttemptRecord,
    AttemptStatus,
    FailureKind,
    GiveUp,
    InFlightAttempt,
    Phase,
    Retry,
    RetryConfig,
    RunningAttempt,
    backoff_delay,
    dead_pools,
    find_stragglers,
    give_up_unplaced,
    is_straggler,
    next_step,
    redispatch_lost,
    straggler_threshold_s,
)

CFG = RetryConfig(max_attempts=4, base_backoff_s=1.0, backoff_multiplier=2.0, max_backoff_s=5.0, jitter_fraction=0.2)


def failed(
    n: int, pool: str, phase: Phase = Phase.PREFILL, kind: FailureKind = FailureKind.ERROR, **kw
) -> AttemptRecord:
    return AttemptRecord("r1", phase, n, pool, AttemptStatus.FAILED, 10.0 * n, 10.0 * n + 1, kind, **kw)


@pytest.mark.parametrize(("failures", "base"), [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (10, 5.0)])
def test_backoff_is_exponential_capped_and_jittered(failures, base):
    rng = random.Random(failures)
    delays = [backoff_delay(failures, CFG, rng) for _ in range(200)]
    assert all(0.8 * base <= d <= 1.2 * base for d in delays)
    assert max(delays) - min(delays) > 0.2 * base  # the jitter is real


def test_retry_goes_elsewhere_with_backoff_then_gives_up_with_the_history():
    rng = random.Random(0)
    history = [failed(0, "gpu-a", detail="CUDA OOM")]
    step = next_step(history, 100.0, CFG, rng)
    assert isinstance(step, Retry)
    assert (step.phase, step.attempt, step.avoid_pools) == (Phase.PREFILL, 1, frozenset({"gpu-a"}))
    assert 100.8 <= step.at <= 101.2 and step.attempt_id == "r1/prefill/1"
    history += [failed(1, "gpu-b"), failed(2, "cpu-c")]
    step = next_step(history, 200.0, CFG, rng)
    assert step.avoid_pools == frozenset({"gpu-a", "gpu-b", "cpu-c"}) and 203.2 <= step.at <= 204.8
    history.append(failed(3, "gpu-a"))
    gave_up = next_step(history, 300.0, CFG, rng)
    assert isinstance(gave_up, GiveUp) and gave_up.failures == 4
    assert "gave up after 4 failed attempts (limit 4)" in gave_up.reason
    assert "#0 prefill on gpu-a: error (CUDA OOM)" in gave_up.reason and "#3 prefill on gpu-a: error" in gave_up.reason


@pytest.mark.parametrize(
    ("record", "phase"),
    [
        (failed(0, "p", Phase.DECODE, FailureKind.ERROR), Phase.DECODE),
        (failed(0, "p", Phase.DECODE, FailureKind.KV_CHECKSUM), Phase.PREFILL),
        (failed(0, "p", Phase.DECODE, FailureKind.WORKER_DEATH, kv_lost=True), Phase.PREFILL),
        (failed(0, "p", Phase.DECODE, FailureKind.WORKER_DEATH), Phase.DECODE),
    ],
)
def test_retry_phase(record, phase):
    step = next_step([record], 0.0, CFG, random.Random(0))
    assert step.phase is phase


def test_invalid_input_is_not_retried():
    step = next_step([failed(0, "p", kind=FailureKind.INVALID)], 0.0, CFG, random.Random(0))
    assert isinstance(step, GiveUp) and "not retryable (invalid)" in step.reason


def test_next_step_refuses_a_history_that_did_not_fail():
    ok = AttemptRecord("r1", Phase.DECODE, 0, "p", AttemptStatus.SUCCEEDED, 0.0, 1.0)
    with pytest.raises(ValueError, match="latest attempt #0 of r1 is SUCCEEDED, not FAILED"):
        next_step([ok], 0.0, CFG, random.Random(0))


def test_straggler_threshold_from_the_profile(mk):
    row = mk.row("p", Phase.DECODE, 1000.0, p99=0.05)  # p99 step 50 ms
    # Decode of 100 tokens: 100 steps x 50 ms = 5 s (service time at batch 8 is 100 x 8 / 500 = 1.6 s).
    assert straggler_threshold_s(row, Phase.DECODE, 100, 8, CFG) == pytest.approx(1.5 * 5.0 + 5.0)
    running = RunningAttempt("r1", Phase.DECODE, 0, "p", mk.MODEL, started_at=0.0, tokens=100, batch_size=8)
    assert not is_straggler(running, row, 12.4, CFG)
    assert is_straggler(running, row, 12.6, CFG)


def test_find_stragglers_adds_one_copy_elsewhere(mk):
    t = mk.table(mk.row("p", Phase.DECODE, 1000.0, p99=0.05))
    pools = [mk.pool("p")]
    slow = RunningAttempt("r1", Phase.DECODE, 1, "p", mk.MODEL, 0.0, 100, 8, attempts_started=2)
    fine = RunningAttempt("r2", Phase.DECODE, 0, "p", mk.MODEL, 10.0, 100, 8)
    (copy,) = find_stragglers([slow, fine], t, pools, 20.0, CFG)
    assert (copy.request_id, copy.phase, copy.attempt, copy.avoid_pools) == ("r1", Phase.DECODE, 2, frozenset({"p"}))
    assert "running 20.0 s > 12.5 s" in copy.reason
    # A request that already has its speculative copy gets no third one.
    twin = RunningAttempt("r1", Phase.DECODE, 2, "q", mk.MODEL, 15.0, 100, 8, attempts_started=3)
    assert find_stragglers([slow, twin], t, pools, 20.0, CFG) == []


def test_dead_pools_by_flag_or_silence(mk):
    pools = [
        mk.pool("ok", heartbeat=100.0),
        mk.pool("quiet", heartbeat=80.0),
        mk.pool("down", alive=False, heartbeat=100.0),
    ]
    assert dead_pools(pools, now=100.0, heartbeat_timeout_s=15.0) == frozenset({"quiet", "down"})


def test_pool_loss_redispatches_and_sends_orphaned_decodes_back_to_prefill():
    dead = frozenset({"gpu-a"})
    in_flight = [
        InFlightAttempt("r1", Phase.PREFILL, 0, "gpu-a", 1),
        InFlightAttempt("r2", Phase.DECODE, 1, "gpu-a", 2, kv_locations=frozenset({"gpu-a"})),
        InFlightAttempt("r3", Phase.DECODE, 1, "gpu-a", 2, kv_locations=frozenset({"gpu-a", "kvstore"})),
        InFlightAttempt("r4", Phase.DECODE, 1, "gpu-b", 2, kv_locations=frozenset({"gpu-a"})),  # pool alive: untouched
        InFlightAttempt("r5", Phase.DECODE, 1, "gpu-a", 3, kv_locations=frozenset({"kvstore"})),
        InFlightAttempt(
            "r5", Phase.DECODE, 2, "gpu-c", 3, kv_locations=frozenset({"kvstore"})
        ),  # live copy finishes it
    ]
    out = {r.request_id: r for r in redispatch_lost(in_flight, dead)}
    assert set(out) == {"r1", "r2", "r3"}
    assert (out["r1"].phase, out["r1"].attempt, out["r1"].kv_lost) == (Phase.PREFILL, 1, False)
    assert (out["r2"].phase, out["r2"].kv_lost, out["r2"].attempt_id) == (Phase.PREFILL, True, "r2/prefill/2")
    assert "its KV lived only there: prefill again" in out["r2"].reason
    assert (out["r3"].phase, out["r3"].kv_lost) == (Phase.DECODE, False)
    assert all(r.avoid_pools == dead for r in out.values())


@pytest.mark.parametrize(("deadline", "since", "now", "gives_up"), [
    (5_000.0, 1_000.0, 2_799.0, False),  # waited 1,799 s of 1,800
    (5_000.0, 1_000.0, 4_999.0, False),  # waited long enough, but the deadline is still ahead: the pool may return
    (5_000.0, 1_000.0, 5_000.0, True),
    (2_000.0, 1_000.0, 2_800.0, True),   # deadline long past: the wait alone decides
    (None, 1_000.0, 2_799.0, False),     # no deadline: only the wait
    (None, 1_000.0, 2_800.0, True),
])
def test_an_unplaced_request_waits_then_gives_up_after_its_deadline(deadline, since, now, gives_up):
    config = RetryConfig(unplaced_give_up_s=1_800.0)
    verdict = give_up_unplaced("r1", deadline, since, now, "p1: alive: pool is not alive", config)
    assert (verdict is not None) is gives_up
    if verdict is not None:
        assert verdict == GiveUp("r1", f"no pool could place it for {now - since:.0f} s and its deadline has passed:"
                                       " p1: alive: pool is not alive", 0)


def test_unplaced_give_up_must_not_be_negative():
    with pytest.raises(ValueError, match="unplaced_give_up_s"):
        RetryConfig(unplaced_give_up_s=-1.0)

