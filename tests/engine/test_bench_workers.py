"""The engine alone on several processes (``bench pipeline``'s shape of a colocated pool): the
shares add up to the one-process run's output, balanced by prompt tokens, and a worker that
fails is reported with its error rather than hanging the bench."""

from __future__ import annotations

import pytest

from phaseroute.engine.bench import BenchConfig, _median_round, engine_alone
from phaseroute.engine.bench_workers import _balanced_shares, _exit_with_parent, engine_alone_workers
from phaseroute.engine.registry import build_executor

TINY = BenchConfig(model="tiny-llama", threads=1, n_prompts=6, prefill_batch=2, max_batch=8)


def _work() -> list[tuple[list[int], int]]:
    return [([3 + (7 * i + j) % 500 for j in range(n)], m) for i, (n, m) in enumerate(zip((40, 12, 30, 8, 20, 16), (6, 4, 5, 3, 6, 4)))]


def test_shares_are_balanced_by_prompt_tokens_and_keep_every_prompt_once() -> None:
    work = _work()
    shares = _balanced_shares(work, 2)
    assert sorted(len(ids) for share in shares for ids, _ in share) == sorted(len(ids) for ids, _ in work)
    assert [sum(len(ids) for ids, _ in share) for share in shares] == [40 + 16 + 8, 30 + 20 + 12]  # longest first, to the lighter


def test_two_processes_produce_what_one_does() -> None:
    work = _work()
    alone = engine_alone(build_executor(TINY.model, TINY.variant, threads=1), work, TINY)
    split = engine_alone_workers(work, TINY, workers=2)
    assert split["workers"] == 2 and len(split["per_worker"]) == 2
    assert split["output_tokens"] == alone["output_tokens"] == sum(w["output_tokens"] for w in split["per_worker"])
    assert split["output_tokens_per_s"] > 0 and split["cpu_s"] > 0
    # each leads its own session (its own autogroup), as the stack's workers do
    assert all(w["own_session"] for w in split["per_worker"])


def test_the_figures_are_the_median_passes() -> None:
    rounds = [({"tokens_per_s": c}, {"tokens_per_s": b}) for c, b in ((90.0, 15.0), (130.0, 12.0), (110.0, 18.0))]
    cb, base = _median_round(rounds)
    assert (cb["tokens_per_s"], base["tokens_per_s"]) == (110.0, 15.0)
    with pytest.raises(ValueError, match="passes=0"):
        BenchConfig(passes=0)


def test_a_worker_ends_once_its_parent_is_gone() -> None:
    parents = iter([100, 100, 1])  # the bench's pid twice, then init's: the bench died
    exits: list[int] = []
    _exit_with_parent(100, getppid=lambda: next(parents), exit_now=exits.append, interval_s=0.0)
    assert exits == [1]


def test_a_worker_that_fails_is_reported_with_its_error() -> None:
    with pytest.raises(RuntimeError, match="no-such-model"):
        engine_alone_workers(_work(), BenchConfig(model="no-such-model", threads=1), workers=2)
