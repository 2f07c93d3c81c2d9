"""Building ``phase_telemetry`` records: one per executed batch, the router's raw material.

A prefill batch is one record. Decode runs continuously, so its "batch" is a window of
consecutive steps (``DecodeWindow``): the record gives the window's mean batch size, tokens
produced, mean and max step latency. A KV fetch is a TRANSFER record naming the source pool,
so the profile builder can measure bandwidth per (source pool, destination pool).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from phaseroute.consumers.handler import Output
from phaseroute.infra.topics import TELEMETRY_PHASE


@dataclass(frozen=True)
class WorkerTag:
    """Who ran the batch."""

    pool: str
    worker_id: str
    model: str
    variant: str


class BatchCounter:
    """Deterministic, unique batch ids per worker: ``<worker_id>/<n>``."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.n = 0

    def next_id(self) -> str:
        self.n += 1
        return f"{self.worker_id}/{self.n}"


def telemetry_output(tag: WorkerTag, batch_id: str, phase: str, **numbers: Any) -> Output:
    """One ``phase_telemetry`` record as an output keyed by pool."""
    record = {
        "batch_id": batch_id, "pool": tag.pool, "worker_id": tag.worker_id, "model": tag.model, "phase": phase,
        "variant": tag.variant, "batch_size": 0, "tokens_in": 0, "tokens_out": 0, "seq_len_mean": 0.0,
        "seq_len_max": 0, "queue_wait_s": 0.0, "exec_time_s": 0.0, "steps": 1, "step_latency_s": 0.0,
        "step_latency_s_max": 0.0, "kv_bytes": 0, "kv_transfer_s": 0.0, "source_pool": None, "status": "OK",
        "error_class": None, "at": int(time.time() * 1000),
    }
    unknown = set(numbers) - set(record)
    if unknown:
        raise KeyError(f"not phase_telemetry fields: {sorted(unknown)}")
    record.update(numbers)
    return Output(TELEMETRY_PHASE, tag.pool, "phase_telemetry", record)


@dataclass
class DecodeWindow:
    """Decode steps accumulated until the window is flushed into one telemetry record."""

    steps: int = 0
    batch_sum: int = 0
    tokens_out: int = 0
    busy_s: float = 0.0
    max_step_s: float = 0.0
    seq_lens: list[int] = field(default_factory=list)

    def add_step(self, batch: int, seconds: float, context_lens: list[int]) -> None:
        self.steps += 1
        self.batch_sum += batch
        self.tokens_out += batch
        self.busy_s += seconds
        self.max_step_s = max(self.max_step_s, seconds)
        self.seq_lens.extend(context_lens)

    def flush(self, tag: WorkerTag, batch_id: str) -> Output | None:
        if self.steps == 0:
            return None
        lens = self.seq_lens or [0]
        out = telemetry_output(
            tag, batch_id, "DECODE", batch_size=round(self.batch_sum / self.steps), tokens_in=0,
            tokens_out=self.tokens_out, seq_len_mean=sum(lens) / len(lens), seq_len_max=max(lens),
            exec_time_s=self.busy_s, steps=self.steps, step_latency_s=self.busy_s / self.steps,
            step_latency_s_max=self.max_step_s,
        )
        self.__init__()  # type: ignore[misc]
        return out
