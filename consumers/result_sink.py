"""Result sink: every job's results into its output in the blob store, one line per request.

Life of a result here: a decode (or colocated) worker, or the control plane for a request
that gave up or was cancelled, produced a ``result`` record keyed by job_id, so one job's
results arrive on one partition, in one sink. For each job in a batch the sink writes the
OpenAI-Batch-shaped lines of custom ids not yet written as one part object under
``tenants/<tenant>/outputs/<job_id>/`` (consumers/output_file.py; replays and speculative copies
are dropped by id). Then it sends a receipt (``output_written`` on ``results.written``) with the
number of lines the job's output now durably holds and their exact tallies (success and error
lines, tokens in and out: ``JobOutput.tally``), which the control plane takes the job's counters
from; it completes a job only on a receipt that covers every request, so a COMPLETED job's
output is whole. The loop commits the offsets after the receipts are produced. A sink killed
at any point redoes at most the uncommitted tail, and the parts' own content makes that
idempotent (a restarted sink counts the same tallies from the parts).

A result whose job id or tenant cannot name a blob key (admission refuses such jobs, so only
a hostile producer makes one) goes to the dead-letter topic with the reason.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from phaseroute.consumers.handler import Completion, Output, WorkItem
from phaseroute.consumers.offsets import TopicPartition
from phaseroute.consumers.output_file import JobOutput, openai_batch_line
from phaseroute.infra.blobstore import BlobStore, output_prefix
from phaseroute.infra.topics import spec_for

RECEIPT_TOPIC = spec_for("results.written").name


class ResultSinkHandler:
    """Writes result records to per-job part objects in the blob store."""

    def __init__(self, store: BlobStore, writer: str) -> None:
        self.store = store
        self.writer = writer
        self._jobs: dict[tuple[str, str], JobOutput] = {}
        self.written = 0
        self.duplicates = 0

    def _output(self, tenant: str, job_id: str) -> JobOutput:
        key = (tenant, job_id)
        if key not in self._jobs:
            try:
                output_prefix(tenant, job_id)
            except ValueError:
                raise ValueError(f"job id {job_id!r} of tenant {tenant!r} cannot name an output in the blob store") from None
            self._jobs[key] = JobOutput(self.store, tenant, job_id)  # a bad stored line is not a bad job id
        return self._jobs[key]

    def capacity(self) -> int:
        return 10_000

    def batch_ready(self, now: float) -> bool:
        return True

    def due_in(self, now: float) -> float:
        return 0.0  # every batch is ready at once (nothing is gathered)

    def admit(self, items: list[WorkItem]) -> list[Completion]:
        done: list[Completion] = []
        by_job: dict[tuple[str, str], list[tuple[WorkItem, Completion]]] = {}
        for item in items:
            result = item.record
            try:
                self._output(result["tenant"], result["job_id"])
            except ValueError as exc:
                done.append(Completion(item, dead_letter_reason=str(exc), error_class="InvalidJobId"))
                continue
            done.append(Completion(item))
            by_job.setdefault((result["tenant"], result["job_id"]), []).append((item, done[-1]))
        at = int(time.time() * 1000)
        for key, entries in by_job.items():
            out = self._jobs[key]
            first = entries[0][0]
            lines = [openai_batch_line(item.record) for item, _ in entries]
            wrote = out.write_part(first.tp[1], first.offset, lines)  # durable before the receipt says so
            self.written += wrote
            self.duplicates += len(lines) - wrote
            entries[-1][1].outputs.append(Output(RECEIPT_TOPIC, key[1], "output_written", {
                "job_id": key[1], **dataclasses.asdict(out.tally),  # lines, ok, failed, tokens_in, tokens_out
                "path": out.prefix, "writer": self.writer, "at": at}))
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
        self._jobs.clear()
