"""Fixtures of the drift tests: executors are loaded once per session and shared."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny() -> Any:
    """tiny-llama in fp32 (no tokenizer; ~0.1 s)."""
    from phaseroute.engine.registry import build_executor

    return build_executor("tiny-llama", "fp32", threads=1)


@pytest.fixture(scope="session")
def smol_fp32() -> Any:
    from phaseroute.engine.registry import build_executor

    return build_executor("smollm2-135m", "fp32", threads=1)


@pytest.fixture(scope="session")
def smol_int8() -> Any:
    from phaseroute.engine.registry import build_executor

    return build_executor("smollm2-135m", "int8-dynamic", threads=1)
