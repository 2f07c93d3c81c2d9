"""The engine alone as a stack would run it: ``workers`` processes of ``threads`` threads each.

``bench pipeline`` compares the live pipeline with its own engine on the same machine. A pool's
workers are sized by ``consumers.machine.plan_pools``, which may run several one-thread
processes rather than one process with every core; the engine alone is measured the same way,
or the ratio would compare two different uses of the machine.

Life of a run: the parent splits the prompts into ``workers`` shares of about equal prompt tokens
(longest first, each to the share with fewest tokens so far) and starts one
process per share (``spawn``: torch reads its thread settings at import). Each builds its own
executor, then waits at a barrier so that no model load is timed; all start together and run
``bench.engine_alone`` on their share (prefill in batches, then continuous-batching decode).
Each process leads a session of its own, as every worker ``phaseroute up`` starts does: with
``sched_autogroup`` the kernel shares the CPU between sessions first, so engine processes left in
the bench's session would get one share between them on a machine with other work, and the
stack's workers one share each (the comparison skewed toward the stack under load).
The result: output tokens of all shares over the wall from the common start to the last
finish, and CPU seconds summed over the processes.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from phaseroute.engine.bench import BenchConfig, engine_alone

_START_TIMEOUT_S = 600.0  # model load in every process, on a busy machine


def engine_alone_workers(work: list[tuple[list[int], int]], config: BenchConfig, workers: int) -> dict[str, Any]:
    """``engine_alone`` on ``workers`` processes of ``config.threads`` threads, side by side."""
    if workers < 1:
        raise ValueError(f"workers={workers} must be >= 1")
    shares = _balanced_shares(work, workers)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=_run_share, args=(share, config, barrier, results), daemon=True) for share in shares if share]
    for proc in procs:
        proc.start()
    try:
        try:
            barrier.wait(timeout=_START_TIMEOUT_S)
        except threading.BrokenBarrierError:
            pass  # a worker failed before the start: its error is on the queue, like every other's
        started = time.time()
        outcomes = [results.get(timeout=_START_TIMEOUT_S) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    failed = [o["error"] for o in outcomes if "error" in o]
    if failed:
        raise RuntimeError(f"an engine-alone worker failed: {failed[0]}")
    wall = max(o["finished_at"] for o in outcomes) - started
    tokens = sum(o["output_tokens"] for o in outcomes)
    cpu = sum(o["cpu_s"] for o in outcomes)
    return {
        "workers": len(procs), "threads": config.threads, "output_tokens": tokens, "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2), "output_tokens_per_s": round(tokens / wall, 2),
        "output_tokens_per_cpu_s": round(tokens / max(cpu, 1e-9), 3),
        "per_worker": [{k: o[k] for k in ("output_tokens", "wall_s", "prefill_s", "decode_s", "decode_mean_batch",
                                          "own_session")} for o in outcomes],
    }


def _balanced_shares(work: list[tuple[list[int], int]], workers: int) -> list[list[tuple[list[int], int]]]:
    """``work`` in ``workers`` shares of about equal prompt tokens, each in its original order."""
    totals, picked = [0] * workers, [[] for _ in range(workers)]  # type: list[int], list[list[int]]
    for i in sorted(range(len(work)), key=lambda i: -len(work[i][0])):
        least = totals.index(min(totals))
        picked[least].append(i)
        totals[least] += len(work[i][0])
    return [[work[i] for i in sorted(indices)] for indices in picked]


def _run_share(work: list[tuple[list[int], int]], config: BenchConfig, barrier: Any, results: Any) -> None:
    from phaseroute.engine.registry import build_executor

    try:
        own_session = _lead_a_session()
        parent = os.getppid()
        threading.Thread(target=_exit_with_parent, args=(parent,), name="exit-with-parent", daemon=True).start()
        ex = build_executor(config.model, config.variant, threads=config.threads)
        barrier.wait(timeout=_START_TIMEOUT_S)  # a broken barrier (another worker failed) raises here
        outcome = engine_alone(ex, work, config)
        results.put({**outcome, "finished_at": time.time(), "own_session": own_session})
    except Exception as exc:  # reported to the parent, which raises it
        barrier.abort()
        results.put({"error": f"{type(exc).__name__}: {exc}"})


def _exit_with_parent(parent: int, getppid: Callable[[], int] = os.getppid,
                      exit_now: Callable[[int], object] = os._exit, interval_s: float = 1.0) -> None:
    """End this process once ``parent`` is gone (its parent id changes): in a session of its
    own, a worker no longer hears the terminal's Ctrl-C, and a bench killed with SIGKILL would
    otherwise leave it computing its share, or waiting out the start barrier, for minutes."""
    while getppid() == parent:
        time.sleep(interval_s)
    exit_now(1)


def _lead_a_session() -> bool:
    """Start a session (and so an autogroup) of this process's own; whether it leads one now."""
    try:
        os.setsid()
    except OSError:  # it leads a process group already: setsid is refused, its session stays
        pass
    return os.getsid(0) == os.getpid()
