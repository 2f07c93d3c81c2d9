"""The control plane without Faust or Kafka, for the record-level tests: an admission desk, the
dispatcher's shell over a ``ControlCore`` with dict tables, a ``JobTracker`` as the tracking loop
feeds it, and the result sink's lines, joined by the records the live topics carry. The pools
are a fleet we do not have here, described by heartbeats and profile rows (fakes for hardware,
as the standards allow); the tokenizer is SmolLM2's real one."""

from __future__ import annotations

from typing import Any

from phaseroute.infra.blobstore import BlobStore, output_prefix
from phaseroute.streams import edge
from phaseroute.streams.admission_desk import AdmissionDesk
from phaseroute.streams.admission_edge import job_admitted
from phaseroute.streams.core import ControlCore, DictStore, JobTracker
from phaseroute.streams.policy import CurvePoint, FairConfig, Phase, ProfileRow, ProfileSource
from phaseroute.streams.profiles.convert import row_to_avro
from phaseroute.streams.settings import core_config
from phaseroute.streams.shell import ControlShell
from phaseroute.streams.views import PoolView, ProfileView

MODEL = "smollm2-135m"


def heartbeat(pool: str, phase: str, now: float, variant: str = "fp32", max_batch: int = 8) -> dict[str, Any]:
    return {"pool": pool, "worker_id": f"{pool}-0", "phase": phase, "variant": variant, "device": "cpu",
            "models": [MODEL], "queue_depth": 0, "consumer_lag": 0, "batch_in_flight": 0, "max_batch": max_batch,
            "memory_bytes": 10**9, "kv_free_bytes": 4 * 10**9, "kv_format": f"{MODEL}|float32|30x3x64|v1",
            "host": "test", "pid": 1, "status": "UP", "started_at": int((now - 60) * 1000), "interval_s": 2.0,
            "at": int(now * 1000)}


def profile(pool: str, phase: Phase, tokens_per_s: float, now: float, error_rate: float = 0.0,
            samples: int = 500, variant: str = "fp32") -> dict[str, Any]:
    row = ProfileRow(MODEL, phase, pool, variant, (CurvePoint(1, tokens_per_s / 4), CurvePoint(8, tokens_per_s)),
                     0.05, 0.08, 0.1, 46080.0, 46080.0, error_rate, 1.0, samples, now, ProfileSource.TELEMETRY)
    return row_to_avro(row, 900.0)


class Plane:
    """The control plane without Faust: an admission desk, a shell over a core with dict tables,
    sharing the views, a job tracker, and the result sink's lines. Records go the live way: the
    desk judges a submission against the shell's load snapshot; its ``jobs.admissions`` record
    goes to the shell and the tracker; the tracker's ``jobs.state`` records go back to the shell;
    every result read is a line of the sink (the first per request), whose receipts carry its
    tallies."""

    def __init__(self, model_info, now: float, fair: FairConfig | None = None, store: DictStore | None = None,
                 prompts: dict | None = None, pools: PoolView | None = None, profiles: ProfileView | None = None,
                 blob_store: BlobStore | None = None):
        config = core_config({MODEL: model_info})
        if fair is not None:
            from dataclasses import replace
            config = replace(config, fair=fair)
        self.config = config
        self.store = store if store is not None else DictStore()
        self.core = ControlCore(config, self.store, seed=1, write_behind=True)  # as the Faust app runs it
        self.pools, self.profiles = pools or PoolView(config.heartbeat_timeout_s), profiles or ProfileView()
        self.shell = ControlShell(self.core, prompts if prompts is not None else {}, {MODEL: model_info},
                                  output_prefix, self.pools, self.profiles)
        self.desk = AdmissionDesk("desk-test", config, {MODEL: model_info}, self.pools, self.profiles, output_prefix,
                                  blob_store)
        self.tracker = JobTracker(config)
        self.lines: dict[str, dict[str, dict[str, Any]]] = {}  # the sink: job -> request id -> its result

    def submit(self, record: dict[str, Any], now: float) -> list:
        self.desk.on_load(self.shell.load("dispatcher-test", now).record)
        verdict, requests = self.desk.submitted(record, self.desk.intake(record), now)
        sends = list(verdict)
        for s in verdict:
            if s.topic == "jobs.admissions":
                sends += self.shell.on_record("job_admission", s.record, now)
                sends += self._tracked(self.tracker.handle(job_admitted(s.record), now), now)
        return sends + list(requests)

    def record(self, kind: str, record: dict[str, Any], now: float) -> list:
        if kind == "result":
            self.lines.setdefault(record["job_id"], {}).setdefault(record["request_id"], record)
        if kind == "output_written":
            return self._tracked(self.tracker.handle(edge.output_written(record), now), now)
        sends = self.shell.on_record(kind, record, now)
        if kind == "job_command":
            event = edge.cancel(record)
            sends += self._tracked(self.tracker.handle(event, now), now) if event is not None else []
        return sends

    def _tracked(self, decisions: list, now: float) -> list:
        """The tracker's job events, and what the dispatcher does on reading the ``jobs.state`` ones."""
        sends = [s for d in decisions for s in edge.job_changed_sends(d, now, output_prefix)]
        return sends + [out for s in sends if s.topic == "jobs.state" for out in self.shell.on_record("job_event", s.record, now)]

    def tick(self, now: float) -> list:
        return self._tracked(self.tracker.tick(now), now) + self.shell.tick(now)

    def job(self, job_id: str) -> dict[str, Any]:
        return self.tracker.jobs[job_id].to_record()

    def requests(self, tenant: str | None = None) -> list:
        return [r for r in self.core.dispatch.requests.values() if tenant is None or r.work.tenant == tenant]


def plane(model_info, pools: dict[str, str], now: float, fair: FairConfig | None = None,
          speed: dict[str, float] | None = None) -> Plane:
    cp = Plane(model_info, now, fair)
    for name, phase in pools.items():
        cp.pools.on_record(heartbeat(name, phase, now))
        phases = [Phase.PREFILL, Phase.DECODE] if phase == "BOTH" else [Phase(phase)]
        for ph in phases:
            base = 500.0 if ph is Phase.PREFILL else 150.0
            cp.profiles.on_record(profile(name, ph, base * (speed or {}).get(name, 1.0), now))
    return cp


def job(job_id: str, tenant: str, n: int, deadline_s: float, now: float, max_tokens: int = 16) -> dict[str, Any]:
    return {"job_id": job_id, "tenant": tenant, "priority": 1, "submitted_at": int(now * 1000),
            "deadline": int((now + deadline_s) * 1000), "model": MODEL, "quality_tier": "EXACT", "quality_tolerance": None,
            "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens},
            "requests": [{"custom_id": f"{tenant}-{i}", "prompt": None, "max_tokens": max_tokens,
                          "messages": [{"role": "user", "content": f"Question number {i}: what is {i} plus {i}?"}]}
                         for i in range(n)], "input_file": None, "output_file": None, "metadata": {}}


def admit_all(cp: Plane, record: dict[str, Any], now: float) -> list:
    sends = cp.submit(record, now)
    for s in sends:
        if s.topic == "requests.pending":
            cp.record("request", s.record, now)
    return sends


def result_of(work: dict[str, Any], now: float, tokens: int = 16, status: str = "OK") -> dict[str, Any]:
    return {"request_id": work["request_id"], "job_id": work["job_id"], "tenant": work["tenant"], "status": status,
            "prompt_tokens": work["prompt_tokens"], "completion_tokens": tokens, "at": int(now * 1000)}


def finish(cp: Plane, work: dict[str, Any], now: float, tokens: int = 16, receipt: bool = True) -> list:
    """A result for the work; with ``receipt``, also the result sink's receipt for the lines it wrote."""
    sends = cp.record("result", result_of(work, now, tokens), now)
    if receipt:
        sends += written(cp, work["job_id"], len(cp.lines.get(work["job_id"], {})), now)
    return sends


def written(cp: Plane, job_id: str, lines: int, now: float) -> list:
    """The sink's receipt for the first ``lines`` lines of the job's output, with their tallies."""
    results = list(cp.lines.get(job_id, {}).values())[:lines]
    ok = [r for r in results if r["status"] == "OK"]
    return cp.record("output_written", {
        "job_id": job_id, "lines": lines, "ok": len(ok), "failed": len(results) - len(ok),
        "tokens_in": sum(r["prompt_tokens"] for r in ok), "tokens_out": sum(r["completion_tokens"] for r in ok),
        "path": f"/tmp/results/{job_id}.jsonl", "writer": "result-sink.test", "at": int(now * 1000)}, now)


def failed(work: dict[str, Any], pool: str, t: float, error: str = "device lost") -> dict[str, Any]:
    return {"attempt_id": work["attempt_id"], "request_id": work["request_id"], "job_id": work["job_id"],
            "tenant": work["tenant"], "attempt": work["attempt"], "phase": "PREFILL", "pool": pool,
            "worker_id": f"{pool}-0", "error_class": "RuntimeError", "error": error, "retryable": True,
            "at": int(t * 1000)}


def states(sends: list) -> list[str]:
    return [s.record["state"] for s in sends if s.topic == "jobs.events"]


def prefill(sends: list) -> list:
    return [s for s in sends if s.topic.startswith("prefill.")]
