"""Small workloads and fleets for the simulator tests (real traces, truncated)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

TRACES = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces"
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
