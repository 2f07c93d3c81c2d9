"""How a stack's workers share the machine's cores: threads per worker and workers per pool.

The rule (used when a pool does not say):

* ``usable_cores()`` is the CPUs this process may run on (``sched_getaffinity``), not the
  machine's total: a container or ``taskset`` limit is respected.
* Workers per pool: ``max(1, cores // (pools x TARGET_THREADS))``: a process per core, as long as
  every pool gets one. Measured on this project's 2-core machines (SmolLM2-135M, fp32, the 48
  mixed prompts of ``bench engine``): two one-thread processes side by side decoded 110-114
  tokens/s *each*, one two-thread process 95-110 in all; prefill was even (2 x 275-283 against
  525-541 tokens/s). A decode step is some 360 small parallel regions besides its matmuls, and
  under ``OMP_WAIT_POLICY=PASSIVE`` (which the engine needs: spinning threads of processes
  sharing the cores slowed a prefill 6-8x) every region wakes a sleeping thread, 0.1-0.4 ms
  each here; a one-thread process wakes none.
* Threads per worker: ``max(1, cores // workers on the machine)``, so the workers together use
  every core once and never oversubscribe them. A one-pool stack on 2 cores: 2 workers x 1
  thread; a prefill pool and a decode pool on 2 cores: 1 worker x 1 thread each.

``plan_pools`` is pure (cores are an argument); ``usable_cores`` is the only read of the machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TARGET_THREADS = 1  # threads per worker beyond which another worker process is the better use of cores (see above)


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


def plan_pools(pools: int, cores: int, workers: dict[int, int] | None = None,
               threads: dict[int, int] | None = None) -> list[WorkerShare]:
    """Workers and threads for each of ``pools`` pools on ``cores`` cores; ``workers`` and
    ``threads`` fix some counts (by pool index). A pool whose threads are fixed gets the workers
    its share of the cores holds at those threads."""
    if pools < 1 or cores < 1:
        raise ValueError(f"a plan needs pools >= 1 and cores >= 1, got pools={pools}, cores={cores}")
    fixed, fixed_threads = workers or {}, threads or {}
    if any(n < 1 for n in fixed_threads.values()):
        raise ValueError(f"thread counts must be >= 1, got {sorted(fixed_threads.values())}")
    counts = [fixed.get(i, max(1, cores // (pools * fixed_threads.get(i, TARGET_THREADS)))) for i in range(pools)]
    if any(n < 1 for n in counts):
        raise ValueError(f"worker counts must be >= 1, got {counts}")
    planned = max(1, cores // sum(counts))
    return [WorkerShare(n, fixed_threads.get(i, planned)) for i, n in enumerate(counts)]


def default_threads(workers_on_machine: int = 1, cores: int | None = None) -> int:
    """Threads for one worker when ``workers_on_machine`` workers share the cores."""
    if workers_on_machine < 1:
        raise ValueError(f"workers_on_machine={workers_on_machine} must be >= 1")
    return max(1, (usable_cores() if cores is None else cores) // workers_on_machine)
