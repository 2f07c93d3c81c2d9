"""Small workloads and fleets for the simulator tests (real traces, truncated)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest


def _traces_dir() -> Path:
    """``$PHASEROUTE_TRACE_DIR``, else the first ``shared/data/traces`` beside the repository or
    a folder above it (a git worktree sits one level deeper than the main checkout)."""
    env = os.environ.get("PHASEROUTE_TRACE_DIR")
    if env:
        return Path(env)
    above = Path(__file__).resolve().parents[3:]
    return next((d / "shared" / "data" / "traces" for d in above if (d / "shared" / "data" / "traces").is_dir()),
                above[0] / "shared" / "data" / "traces")


TRACES = _traces_dir()
AZURE = TRACES / "azure2023_code.csv"
MOONCAKE = TRACES / "mooncake_conversation.jsonl"


def workload_dict(trace: Path = AZURE, model: str = "llama-3.1-8b", **extra) -> dict:
    spec = {
        "name": "test", "trace": str(trace), "model": model, "seed": 3,
        "tenants": [
            {"name": "gold", "weight": 3, "share": 0.4, "job_size": [20, 60], "deadline_min": [5, 15]},
            {"name": "bronze", "weight": 1, "share": 0.6, "job_size": [40, 120], "deadline_min": [10, 40]},
        ],
    }
    spec.update(extra)
    return spec


def fleet_dict(**extra) -> dict:
    spec = {
        "name": "tiny", "failures": False,
        "pools": [
            {"name": "h100", "accelerator": "H100-SXM-80GB", "count": 1, "models": ["llama-3.1-8b"]},
            {"name": "a100", "accelerator": "A100-SXM-40GB", "count": 2, "models": ["llama-3.1-8b"]},
        ],
    }
    spec.update(extra)
    return spec


@pytest.fixture()
def sim_inputs() -> SimpleNamespace:
    if not AZURE.is_file():
        pytest.fail(f"trace {AZURE} is missing (the shared traces folder must sit beside the repository)")
    return SimpleNamespace(workload=workload_dict, fleet=fleet_dict, azure=AZURE, mooncake=MOONCAKE)
