"""The demo's tenants and jobs: one tenant floods, two submit small urgent or approximate jobs,
one job is infeasible (rejected with a feasible deadline) and one is resubmitted (run once)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

QUESTIONS = (
    "What is the capital of France?", "Name three colours of the rainbow.", "Explain what a queue is in one sentence.",
    "Write a haiku about rain.", "What is 12 times 7?", "Give me one tip for learning to cook.",
    "Why is the sky blue?", "Describe a cat in five words.", "What does a compiler do?",
    "List two uses of a kettle.", "What is the boiling point of water at sea level?", "Name a planet with rings.",
    "Summarize the rules of chess in two sentences.", "What is a prime number?", "Translate 'good morning' into French.",
    "Why do leaves change colour in autumn?",
)
CONTEXT = ("The railway reached the town in 1870. Within ten years the population doubled, the market moved beside "
           "the station, and the old coaching inn closed. ")

# in-flight caps bound what one tenant holds of the fleet's ~24 concurrent slots
TENANTS = {
    "flood-co": {"weight": 1, "max_in_flight": 8},
    "acme": {"weight": 2, "max_in_flight": 12},
    "globex": {"weight": 1, "max_in_flight": 8},
}


@dataclass(frozen=True)
class DemoJob:
    job_id: str
    tenant: str
    priority: int
    requests: int
    deadline: str
    quality: str = "exact"
    tolerance: float | None = None
    max_tokens: int = 24
    resubmit: bool = False  # submitted twice: the second must not run
    via_api: bool = False  # submitted through the Batch API with the openai SDK (the API names the job)


def demo_jobs(run: str, scale: float = 1.0) -> list[DemoJob]:
    def n(k: int) -> int:
        return max(2, int(k * scale))

    return [
        DemoJob(f"{run}-flood", "flood-co", 1, n(40), "20m"),
        DemoJob(f"{run}-acme-1", "acme", 3, n(8), "10m", resubmit=True),
        DemoJob(f"{run}-acme-2", "acme", 3, n(8), "10m"),
        DemoJob(f"{run}-globex", "globex", 2, n(10), "15m", quality="approximate", tolerance=0.6, via_api=True),
        DemoJob(f"{run}-acme-rush", "acme", 5, n(40), "3s"),  # infeasible: rejected with a feasible deadline
    ]


def write_input(job: DemoJob, directory: Path) -> Path:
    """The job's OpenAI Batch input file (chat requests of varied length)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{job.job_id}.jsonl"
    with path.open("w") as fh:
        for i in range(job.requests):
            question = QUESTIONS[(i + len(job.tenant)) % len(QUESTIONS)]
            content = (CONTEXT * (i % 4)) + question
            fh.write(json.dumps({
                "custom_id": f"{job.tenant}-{i}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "smollm2-135m", "messages": [{"role": "user", "content": content}],
                         "max_tokens": job.max_tokens},
            }) + "\n")
    return path
