"""Engine fixtures: a tiny deterministic model for unit tests, the real SmolLM2 for `model` tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny() -> Any:
    """tiny-llama in fp32 (2 layers, GQA 4/2 heads): loads in ~0.1 s, no tokenizer."""
    from phaseroute.engine.registry import build_executor

    return build_executor("tiny-llama", "fp32", threads=1)


@pytest.fixture(scope="session")
def smol() -> Any:
    """The real SmolLM2-135M-Instruct in fp32 on 2 threads (converted once, then ~2-4 s to load)."""
    from phaseroute.engine.registry import build_executor

    return build_executor("smollm2-135m", "fp32", threads=2)


def run_to_end(session: Any, max_steps: int = 10_000) -> dict[str, Any]:
    """Step a decode session until it is empty; finished sequences by request id."""
    done: dict[str, Any] = {}
    for _ in range(max_steps):
        for seq in session.step():
            done[seq.request_id] = seq
        if not session.running():
            return done
    raise AssertionError(f"session still running after {max_steps} steps")


@pytest.fixture()
def drain() -> Any:
    return run_to_end
