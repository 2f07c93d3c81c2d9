"""An admission desk: the verdict on each submitted job of the partitions it owns, without Kafka.

Every control-plane instance runs one (``streams/admitter.py`` feeds it from ``jobs.submitted``,
partitioned by job id across the instances of the admission group). Life of a job here:
1. ``intake`` (blocking: run it off any event loop) reads the input from the tenant's own
   blob-store prefix, validates it line by line, renders and counts the prompts into a spool;
2. ``submitted`` judges it with ``admission.judge`` (the function the control core runs in the
   simulator) against the backlog of the dispatcher's last load snapshot (``control.load``) plus
   this desk's own admissions the snapshot does not hold yet, and the fleet's rate per model in
   that snapshot (the dispatcher's view; where it gives a model none, the pools as heartbeats say
   and the measured profiles, as for the per-worker KV limit). It returns the verdict's sends
   (the job on ``jobs.admissions``, for the tracker; its event on ``jobs.events`` /
   ``jobs.state``), which the caller makes durable first, then the admitted job's requests for
   ``requests.pending``, streamed from the spool with their text (a 50,000-line job is never a
   list of records in memory). The line errors of an invalid file go to the blob store for the
   Batch API.
3. ``learn`` takes a verdict read back from ``jobs.admissions``: a desk that is given a partition
   (at start, or from an instance that left) first reads the partition's verdicts, so an id
   judged before is never run again, wherever it was judged.
Two desks may judge at the same moment against the same snapshot: admission is optimistic within
the snapshot's age (about a second), and each desk counts its own admissions at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from phaseroute.infra import topics
from phaseroute.infra.blobstore import BlobStore
from phaseroute.streams import edge
from phaseroute.streams.admission_edge import Load, admission_send, admitted_job, load_of
from phaseroute.streams.core import CoreConfig, JobChanged, JobRecord, PromptSize, QueueRequest, judge
from phaseroute.streams.edge import Send
from phaseroute.streams.intake import IntakeLimits, IntakeScan, scan_job_input
from phaseroute.streams.model_catalog import ModelInfo
from phaseroute.streams.policy import BacklogJob
from phaseroute.streams.validation_report import write_validation_errors
from phaseroute.streams.views import PoolView, ProfileView


class AdmissionDesk:
    def __init__(self, name: str, config: CoreConfig, models: dict[str, ModelInfo], pools: PoolView,
                 profiles: ProfileView, output_file: Callable[[str, str], str | None], store: BlobStore | None = None,
                 limits: IntakeLimits = IntakeLimits()) -> None:
        self.name, self.config, self.models = name, config, models
        self.pools, self.profiles = pools, profiles
        self.output_file = output_file
        self.store, self.limits = store, limits
        self.known: dict[str, JobRecord] = {}  # verdicts by job id, of the partitions this desk owns
        self.load: Load | None = None
        self._own: dict[str, tuple[float, BacklogJob]] = {}  # this desk's admissions: (when, backlog entry)
        self.judged = 0

    # -- what the desk reads besides submissions ---------------------------------------------------
    def learn(self, record: dict[str, Any]) -> None:
        """A verdict from ``jobs.admissions`` (this desk's own, or another desk's before it)."""
        job = admitted_job(record)
        held = self.known.get(job.job_id)
        if held is None or held.submissions <= job.submissions:
            self.known[job.job_id] = job

    def on_load(self, record: dict[str, Any]) -> None:
        """The dispatcher's load snapshot (the newest one wins)."""
        load = load_of(record)
        if self.load is None or load.at >= self.load.at:
            self.load = load
            for job_id in [j for j, (at, _) in self._own.items() if at <= load.admissions_through]:
                del self._own[job_id]  # the snapshot holds it now (or it finished)

    def load_age(self, now: float) -> float | None:
        return None if self.load is None else now - self.load.at

    def backlog(self) -> list[BacklogJob]:
        """The snapshot's backlog plus this desk's admissions it does not hold yet."""
        held = list(self.load.backlog) if self.load is not None else []
        seen = {b.job_id for b in held}
        return held + [b for _, b in self._own.values() if b.job_id not in seen]

    # -- jobs in -----------------------------------------------------------------------------------
    def intake(self, record: dict[str, Any]) -> IntakeScan | None:
        """Read, validate, render and count the job's input (blocking). None for an unknown model
        (``submitted`` rejects the job)."""
        model = self.models.get(record["model"])
        if model is None:
            return None
        return scan_job_input(record, self.store, model, self.limits)

    def submitted(self, record: dict[str, Any], scan: IntakeScan | None,
                  now: float) -> tuple[list[Send], Iterator[Send]]:
        """(the verdict's sends, to make durable first; the admitted requests, streamed)."""
        error = None
        if scan is None:
            error = f"unknown model {record['model']!r}; this deployment serves {sorted(self.models)}"
        elif not scan.ok:
            error = scan.reason()
            if scan.errors and self.store is not None:
                write_validation_errors(self.store, record["tenant"], record["job_id"], scan)
        sizes = [PromptSize(p.custom_id, p.tokens, p.max_tokens) for p in scan.prompts] if scan and scan.ok else []
        ev = edge.job_submitted(record, sizes, error)
        pools = tuple(self.pools.states(now, {}, {}).values())
        verdict = judge(ev, self.known.get(ev.job_id), self.backlog(), pools, self.profiles.table(),
                        self.config.quotas, self.config, now, self.load.fleet if self.load is not None else None)
        self.judged += 1
        sends: list[Send] = []
        job = verdict.job
        if verdict.fresh:
            self.known[job.job_id] = job
            sends.append(admission_send(job, self.name, now))
            if job.requests_total:
                self._own[job.job_id] = (now, BacklogJob(job.job_id, job.tenant, job.model, job.deadline,
                                                         job.prefill_left, job.decode_left))
        queued = [d for d in verdict.decisions if isinstance(d, QueueRequest)]
        for d in verdict.decisions:
            if isinstance(d, JobChanged):
                output = self.output_file(d.job["tenant"], d.job["job_id"]) if d.job["requests_total"] else None
                sends += edge.job_event_sends(d, now, output)
        if scan is None or not queued:
            if scan is not None:
                scan.close()
            return sends, iter(())
        return sends, self._requests(queued, scan, record)

    def _requests(self, queued: list[QueueRequest], scan: IntakeScan, record: dict[str, Any]) -> Iterator[Send]:
        """The requests with their texts from the spool (which is closed once they are out)."""
        try:
            for d, text in zip(queued, scan.texts(), strict=True):
                yield Send(topics.REQUESTS_PENDING, d.request.tenant, "request",
                           edge.pending_request(d.request, text, record["sampling"], int(record["submitted_at"])))
        finally:
            scan.close()
