"""How a stack's workers share the machine's cores: threads, workers and CPU priority per pool.

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
* Threads per worker: ``max(1, cores // workers)``, so the workers use every core once.
* **Prefill first.** The pools that prefill (``prefill``, ``both``) share the cores as above. A
  decode-only pool beside them does not take cores from them: it is planned over every core as
  if it were alone (the decode pools share them), at a lower CPU priority (``nice``
  ``DECODE_NICE``). Its workers take the cores the prefilling pools leave idle and yield them
  while both have work, so the cores go where the measured demand is, without a plan of it:
  when the prompts are long, the prefill workers hold the cores and decode gathers its
  sequences into a large batch, the most efficient one (a step at batch 24 costs ~3.7x one
  at batch 1 here and makes 24 tokens); when prefill runs dry, decode runs on every core. This
  is the order vLLM's scheduler and the engine alone run a batch in (prefill, then decode).
  ``bench pipeline``, disaggregated on 2 cores: 1+1 one-thread workers 0.60-0.64x the engine
  alone; 2+2 at equal priority 0.57x (four processes, half a core each, the prefill ones the
  bottleneck); 2+2 with the decode workers at nice 10 0.72-0.78x (2026-12-07, docs/throughput.md).
  A decode pool starved while prefill keeps every core busy still gets about a tenth of a core
  per core (nice 10 against 0); its decode work beyond the worker's batch waits in its topic and
  the KV on the store.
  A stack with no prefilling pool plans decode pools at normal priority.

``plan_pools`` is pure (cores are an argument); ``usable_cores`` and ``lower_priority`` are the
only touches of the machine.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TARGET_THREADS = 1  # threads per worker beyond which another worker process is the better use of cores (see above)
DECODE_NICE = 10  # CPU priority of decode-only workers beside prefilling pools (nice: 0 normal, 19 lowest)
PREFILLING_PHASES = ("prefill", "both")


@dataclass(frozen=True)
class WorkerShare:
    """One pool's share of the machine."""

    workers: int
    threads: int
    nice: int = 0


def usable_cores() -> int:
    """CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def plan_pools(phases: Sequence[str], cores: int, workers: dict[int, int] | None = None,
               threads: dict[int, int] | None = None) -> list[WorkerShare]:
    """Workers, threads and CPU priority for pools of ``phases`` (one per pool) on ``cores`` cores;
    ``workers`` and ``threads`` fix some counts (by pool index). A pool whose threads are fixed
    gets the workers its share of the cores holds at those threads."""
    if not phases or cores < 1:
        raise ValueError(f"a plan needs at least one pool and cores >= 1, got phases={list(phases)}, cores={cores}")
    fixed, fixed_threads = workers or {}, threads or {}
    if any(n < 1 for n in fixed_threads.values()):
        raise ValueError(f"thread counts must be >= 1, got {sorted(fixed_threads.values())}")
    prefilling = [i for i, phase in enumerate(phases) if phase in PREFILLING_PHASES]
    decoding = [i for i in range(len(phases)) if i not in prefilling]
    groups = [(prefilling, 0), (decoding, DECODE_NICE if prefilling else 0)]
    shares: dict[int, WorkerShare] = {}
    for members, nice in groups:
        if not members:
            continue
        counts = {i: fixed.get(i, max(1, cores // (len(members) * fixed_threads.get(i, TARGET_THREADS)))) for i in members}
        if any(n < 1 for n in counts.values()):
            raise ValueError(f"worker counts must be >= 1, got {sorted(counts.values())}")
        planned = max(1, cores // sum(counts.values()))
        shares.update({i: WorkerShare(n, fixed_threads.get(i, planned), nice) for i, n in counts.items()})
    return [shares[i] for i in range(len(phases))]


def lower_priority(nice: int) -> int:
    """Run this process at CPU priority ``nice`` (0-19; a process may only lower its own); return
    the nice its threads have now. Every thread of the process is reniced (Linux keeps a nice
    per thread), and so is its autogroup when the process leads a session of its own, as the
    stack's workers do: with ``kernel.sched_autogroup_enabled`` the kernel shares the CPU between
    sessions first, and a thread's nice only counts inside its session."""
    if not 0 <= nice <= 19:
        raise ValueError(f"nice={nice} must be 0-19")
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice <= current:
        return current
    for tid in _threads():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:  # the thread ended meanwhile
            pass
    autogroup = Path("/proc/self/autogroup")
    if os.getsid(0) == os.getpid() and autogroup.exists():
        try:
            autogroup.write_text(str(nice))
        except OSError:  # a read-only /proc: the threads' nice still holds within the session
            pass
    return os.getpriority(os.PRIO_PROCESS, 0)


def _threads() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: this thread only
        return [0]


def default_threads(workers_on_machine: int = 1, cores: int | None = None) -> int:
    """Threads for one worker when ``workers_on_machine`` workers share the cores."""
    if workers_on_machine < 1:
        raise ValueError(f"workers_on_machine={workers_on_machine} must be >= 1")
    return max(1, (usable_cores() if cores is None else cores) // workers_on_machine)
