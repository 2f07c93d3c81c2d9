"""Result sink: every job's results into its output file, exactly one line per request.

Life of a result here: a decode (or colocated) worker produced a ``result`` record keyed by
job_id, so one job's results arrive on one partition, in one sink. The sink appends the
OpenAI-Batch-shaped line to ``<results_dir>/<job_id>.jsonl`` unless that custom id is
already there (replays and speculative copies are dropped by id) and fsyncs the file. Then,
for every job in the batch, it sends a receipt (``output_written`` on ``results.written``) with
the number of lines the file now durably holds; the control plane completes a job only on a
receipt that covers every request, so a COMPLETED job's output file is whole. The loop
commits the offsets after the receipts are produced. A sink killed at any point redoes at most
the uncommitted tail, and the file's own content makes that idempotent; a replayed batch sends
its receipts again, which the control plane reads as "at least this many lines".
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from phaseroute.consumers.handler import Completion, Output, WorkItem
from phaseroute.consumers.offsets import TopicPartition
from phaseroute.consumers.output_file import JobOutputFile, openai_batch_line

RECEIPT_TOPIC = "results.written"


class ResultSinkHandler:
    """Writes result records to per-job output files."""

    def __init__(self, results_dir: Path, writer: str) -> None:
        self.results_dir = results_dir
        self.writer = writer
        self._files: dict[str, JobOutputFile] = {}
        self.written = 0
        self.duplicates = 0

    def output_path(self, job_id: str) -> Path:
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise ValueError(f"job id {job_id!r} cannot name an output file")
        return self.results_dir / f"{job_id}.jsonl"

    def _file(self, job_id: str) -> JobOutputFile:
        if job_id not in self._files:
            self._files[job_id] = JobOutputFile(self.output_path(job_id))
        return self._files[job_id]

    def capacity(self) -> int:
        return 10_000

    def batch_ready(self, now: float) -> bool:
        return True

    def admit(self, items: list[WorkItem]) -> list[Completion]:
        last_of_job: dict[str, Completion] = {}
        done = []
        for item in items:
            result = item.record
            try:
                out = self._file(result["job_id"])
            except ValueError as exc:
                done.append(Completion(item, dead_letter_reason=str(exc), error_class="InvalidJobId"))
                continue
            if out.append(openai_batch_line(result)):
                self.written += 1
            else:
                self.duplicates += 1
            done.append(Completion(item))
            last_of_job[result["job_id"]] = done[-1]
        at = int(time.time() * 1000)
        for job_id, completion in last_of_job.items():
            out = self._files[job_id]
            out.sync()  # durable before the receipt says so
            completion.outputs.append(Output(RECEIPT_TOPIC, job_id, "output_written", {
                "job_id": job_id, "lines": len(out.written), "path": str(out.path), "writer": self.writer, "at": at}))
        return done

    def step(self) -> list[Completion]:
        return []

    def in_flight(self) -> int:
        return 0

    def drop(self, tps: list[TopicPartition]) -> int:
        return 0

    def telemetry(self) -> list[Output]:
        return []

    def status(self) -> dict[str, Any]:
        return {"batch_in_flight": 0, "max_batch": 0, "memory_bytes": 0, "kv_free_bytes": 0, "at": time.time()}

    def close(self) -> None:
        for out in self._files.values():
            out.close()
