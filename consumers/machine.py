"""How a stack's workers share the machine's cores: threads per worker and workers per pool.

The rule (used when a pool does not say):

* ``usable_cores()`` is the CPUs this process may run on (``sched_getaffinity``), not the
  machine's total: a container or ``taskset`` limit is respected.
* Workers per pool: ``max(1, cores // (pools x TARGET_THREADS))``. One process per pool until
  the machine has more than ``TARGET_THREADS`` cores per pool: torch's intra-op threads stop
  paying off for a small model around 4-8 threads, while another process (its own batch, its
  own share of the partitions) keeps scaling.
* Threads per worker: ``max(1, cores // workers on the machine)``, so the workers together use
  every core once and never oversubscribe them (OpenMP threads fighting over a core are much
  slower than fewer threads). A one-pool stack on 2 cores: 1 worker x 2 threads; a prefill pool
  and a decode pool on 2 cores: 1 thread each, running at the same time.

``plan_pools`` is pure (cores are an argument); ``usable_cores`` is the only read of the machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TARGET_THREADS = 4  # threads per worker beyond which another worker process is the better use of cores


@dataclass(frozen=True)
class WorkerShare:
    """One pool's share of the machine."""

    workers: int
    threads: int


def usable_cores() -> int:
    """CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def plan_pools(pools: int, cores: int, workers: dict[int, int] | None = None) -> list[WorkerShare]:
    """Workers and threads for each of ``pools`` pools on ``cores`` cores; ``workers`` fixes some counts (by pool index)."""
    if pools < 1 or cores < 1:
        raise ValueError(f"a plan needs pools >= 1 and cores >= 1, got pools={pools}, cores={cores}")
    fixed = workers or {}
    default = max(1, cores // (pools * TARGET_THREADS))
    counts = [fixed.get(i, default) for i in range(pools)]
    if any(n < 1 for n in counts):
        raise ValueError(f"worker counts must be >= 1, got {counts}")
    threads = max(1, cores // sum(counts))
    return [WorkerShare(n, threads) for n in counts]


def default_threads(workers_on_machine: int = 1, cores: int | None = None) -> int:
    """Threads for one worker when ``workers_on_machine`` workers share the cores."""
    if workers_on_machine < 1:
        raise ValueError(f"workers_on_machine={workers_on_machine} must be >= 1")
    return max(1, (usable_cores() if cores is None else cores) // workers_on_machine)
