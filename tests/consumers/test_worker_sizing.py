"""Workers that use the machine: threads and workers per pool from the cores, the prefill token budget."""

from __future__ import annotations

import subprocess
import sys

import pytest

from phaseroute.consumers.machine import (
    DECODE_NICE,
    WorkerShare,
    default_threads,
    lower_priority,
    plan_pools,
    usable_cores,
)
from phaseroute.consumers.prefill_budget import TokenBudget, budget_batch_size, efficient_batch_size


def test_one_pool_on_two_cores_is_two_one_thread_workers() -> None:
    assert plan_pools(["both"], 2) == [WorkerShare(workers=2, threads=1)]


def test_prefilling_pools_share_the_cores_without_oversubscribing_them() -> None:
    assert plan_pools(["prefill", "both"], 2) == [WorkerShare(1, 1), WorkerShare(1, 1)]
    assert plan_pools(["both"] * 3, 2) == [WorkerShare(1, 1)] * 3  # never below one thread
    assert plan_pools(["decode", "decode"], 2) == [WorkerShare(1, 1), WorkerShare(1, 1)]  # no prefill: normal priority


def test_decode_pools_beside_prefilling_ones_get_every_core_again_at_a_lower_priority() -> None:
    assert plan_pools(["prefill", "decode"], 2) == [WorkerShare(2, 1), WorkerShare(2, 1, nice=DECODE_NICE)]
    assert plan_pools(["prefill", "decode", "both"], 2) == [WorkerShare(1, 1), WorkerShare(2, 1, DECODE_NICE),
                                                            WorkerShare(1, 1)]  # the demo's pools
    assert plan_pools(["decode", "decode", "prefill"], 4) == [WorkerShare(2, 1, DECODE_NICE)] * 2 + [WorkerShare(4, 1)]
    assert 0 < DECODE_NICE <= 19


def test_big_machines_get_more_workers_not_more_threads() -> None:
    assert plan_pools(["both"], 16) == [WorkerShare(16, 1)]
    assert plan_pools(["prefill", "both"], 16) == [WorkerShare(8, 1), WorkerShare(8, 1)]
    assert plan_pools(["prefill", "both"], 16, workers={0: 2}) == [WorkerShare(2, 1), WorkerShare(8, 1)]
    assert plan_pools(["both"], 16, workers={0: 4}) == [WorkerShare(4, 4)]  # fewer workers fixed: threads use the cores
    assert plan_pools(["both", "prefill"], 8, threads={0: 2}) == [WorkerShare(2, 2), WorkerShare(4, 1)]  # fixed threads


def test_bad_plans_name_the_values() -> None:
    with pytest.raises(ValueError, match="cores=0"):
        plan_pools(["both"], 0)
    with pytest.raises(ValueError, match=r"phases=\[\]"):
        plan_pools([], 2)
    with pytest.raises(ValueError, match=r"\[0\]"):
        plan_pools(["both"], 4, workers={0: 0})
    with pytest.raises(ValueError, match=r"thread counts must be >= 1, got \[0\]"):
        plan_pools(["both"], 4, threads={0: 0})
    with pytest.raises(ValueError, match="workers_on_machine=0"):
        default_threads(0)
    with pytest.raises(ValueError, match="nice=20 must be 0-19"):
        lower_priority(20)


def test_a_worker_lowers_the_priority_of_every_thread_and_of_its_own_session() -> None:
    """In a child that leads its own session (as the stack starts workers): a thread started
    before the call is reniced too, and so is the session's autogroup where the kernel has one."""
    script = (
        "import os, threading, time, sys\n"
        "from phaseroute.consumers.machine import lower_priority\n"
        "stop = threading.Event(); t = threading.Thread(target=stop.wait); t.start()\n"
        "print(lower_priority(7), lower_priority(3))\n"  # a process may not raise itself again
        "print(os.getpriority(os.PRIO_PROCESS, t.native_id))\n"
        "path = '/proc/self/autogroup'\n"
        "print(open(path).read().split()[-1] if os.path.exists(path) else 'none')\n"
        "stop.set()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          start_new_session=True, check=True)
    first, thread_nice, autogroup = done.stdout.split("\n")[:3]
    assert first == "7 7" and thread_nice == "7"
    assert autogroup in ("7", "none")


def test_default_threads_split_the_usable_cores() -> None:
    assert default_threads(1, cores=8) == 8 and default_threads(3, cores=8) == 2 and default_threads(9, cores=8) == 1
    assert default_threads() == usable_cores() >= 1


def test_efficient_batch_is_the_smallest_reaching_ninety_percent_of_the_best() -> None:
    assert efficient_batch_size([(1, 410.0), (2, 430.0), (4, 440.0), (8, 445.0)]) == 1  # compute-bound CPU
    assert efficient_batch_size([(8, 3000.0), (1, 500.0), (4, 2800.0), (16, 3100.0)]) == 4  # unsorted input
    assert efficient_batch_size([(8, 3000.0), (1, 500.0), (4, 2700.0), (16, 3100.0)]) == 8
    assert efficient_batch_size([]) is None and efficient_batch_size([(0, 5.0), (2, 0.0)]) is None


def test_a_curve_still_rising_at_its_largest_batch_leaves_the_budget_at_the_ceiling() -> None:
    assert budget_batch_size([(1, 292.5), (4, 471.9)]) is None  # the quick cold-start grid on this machine
    assert budget_batch_size([(1, 500.0), (4, 2800.0), (8, 3000.0), (16, 3100.0)]) == 4  # flattened past 4
    assert budget_batch_size([(1, 410.0), (4, 440.0)]) == 1  # compute-bound: batching adds nothing
    assert budget_batch_size([(1, 300.0)]) is None and budget_batch_size([]) is None


def test_token_budget_follows_the_mean_prompt_within_the_ceiling() -> None:
    budget = TokenBudget(ceiling=4096, efficient_batch=2)
    assert budget.tokens() == 4096  # nothing seen yet
    for n in (100, 300):
        budget.observe(n)
    assert budget.mean_prompt_tokens == 200 and budget.tokens() == 400
    budget.observe(20_000)
    assert budget.tokens() == 4096
    assert TokenBudget(ceiling=512).tokens() == 512  # no profile: the configured ceiling
