"""Fixtures of the control-plane tests."""

from __future__ import annotations

import pytest

from phaseroute.config import settings
from phaseroute.streams.model_catalog import ModelInfo, load_model_info


@pytest.fixture(scope="module")
def model_info() -> ModelInfo:
    """SmolLM2's catalogue entry with its real tokenizer (from the local model cache)."""
    return load_model_info("smollm2-135m", settings().model_cache)
