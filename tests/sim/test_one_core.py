"""One code path: the simulator's phaseroute policy is the control core the Faust app runs, and
one recorded event log gives the same decisions whether the simulator feeds it to the core or the
live shell does (through the Avro records the Kafka topics carry)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from phaseroute.sim.core_driver import CoreDriver, PhaserouteOptions
from phaseroute.sim.runner import prepare, run_policy
from phaseroute.streams import app as live_app
from phaseroute.streams import edge
from phaseroute.streams.core import (
    AttemptFailed,
    ControlCore,
    Dispatch,
    FailRequest,
    FleetObserved,
    JobChanged,
    JobEnded,
    JobSubmitted,
    KvReady,
    ProfilesUpdated,
    RequestQueued,
    ResultReceived,
)
from phaseroute.streams.shell import ControlShell


def test_the_faust_app_and_the_simulator_run_the_same_core_class() -> None:
    assert live_app.ControlCore is ControlCore
    import phaseroute.sim.core_driver as driver
    assert driver.ControlCore is ControlCore


class Recording(CoreDriver):
    """The simulator's driver, keeping every input the core got and every decision it made."""

    def make_core(self, config: Any, seed: int) -> ControlCore:
        self.log: list[tuple[float, Any, list[Any]]] = []
        self.seed = seed
        core = super().make_core(config, seed)
        handle, tick = core.handle, core.tick

        def recorded_handle(event: Any, now: float) -> list[Any]:
            out = handle(event, now)
            self.log.append((now, event, out))
            return out

        def recorded_tick(now: float) -> list[Any]:
            out = tick(now)
            self.log.append((now, None, out))
            return out

        core.handle, core.tick = recorded_handle, recorded_tick  # type: ignore[method-assign]
        return core


def as_record(event: Any) -> tuple[str, dict[str, Any]] | None:
    """The Avro record a Kafka topic would carry for ``event`` (None: the shell builds it from its views)."""
    ms = edge.ms
    if isinstance(event, RequestQueued):
        return "request", edge.pending_request(event, "text", {"temperature": 0.0, "max_tokens": event.max_tokens}, 0)
    if isinstance(event, KvReady):
        return "kv_ready", {"request_id": event.request_id, "attempt": event.attempt_number, "prefill_pool": event.pool}
    if isinstance(event, ResultReceived):
        return "result", {"request_id": event.request_id, "job_id": event.job_id,
                          "status": "OK" if event.ok else "FAILED", "prompt_tokens": event.prompt_tokens,
                          "completion_tokens": event.completion_tokens}
    if isinstance(event, AttemptFailed):
        return "attempt_failed", {"request_id": event.request_id, "attempt": event.attempt_number, "pool": event.pool,
                                  "phase": event.phase.value, "error_class": "WorkerDeath", "error": event.detail,
                                  "retryable": True}
    if isinstance(event, JobEnded):  # the tracker's final state of the job, as jobs.state carries it
        return "job_event", {"job_id": event.job_id, "state": event.state.value, "reason": event.reason,
                             "requests_done": event.done, "requests_failed": event.failed,
                             "lines_written": event.lines_written}
    if isinstance(event, JobSubmitted):
        return "job_submitted", {"job_id": event.job_id, "tenant": event.tenant, "model": event.model,
                                 "priority": event.priority, "submitted_at": ms(event.submitted_at),
                                 "deadline": ms(event.deadline or 0.0), "quality_tier": event.quality_tier.value,
                                 "quality_tolerance": event.quality_tolerance, "sampling": {"temperature": 0.0}}
    return None


def summary(decisions: list[Any]) -> list[tuple[Any, ...]]:
    out = []
    for d in decisions:
        if isinstance(d, Dispatch):
            out.append(("dispatch", d.work.request_id, d.attempt, d.prefill_pool, d.decode_pool, d.speculative))
        elif isinstance(d, FailRequest):
            out.append(("fail", d.work.request_id, d.code))
        elif isinstance(d, JobChanged):
            out.append(("job", d.job["job_id"], d.kind.value, d.job["state"], d.job["done"], d.job["failed"]))
    return out


def test_one_recorded_log_gives_the_same_decisions_through_the_simulator_and_the_live_shell(sim_inputs) -> None:
    fleet = sim_inputs.fleet(failures=True, pools=[
        {"name": "h100", "accelerator": "H100-SXM-80GB", "count": 1, "models": ["llama-3.1-8b"], "mtbf_hours": 0.05,
         "repair_minutes": 1},
        {"name": "a100", "accelerator": "A100-SXM-40GB", "count": 2, "models": ["llama-3.1-8b"]}])
    w, f, _ = prepare(sim_inputs.workload(max_requests=600), fleet, load=0.9)
    driver = Recording(PhaserouteOptions())
    sim, _ = run_policy(w, f, "phaseroute", driver=driver)
    assert sum(1 for _, e, _ in driver.log if isinstance(e, AttemptFailed)) > 0, "the run should see failures"

    core = ControlCore(replace(driver.core.config), seed=driver.seed)
    shell = ControlShell(core, {}, {}, lambda tenant, job_id: None, pools=None, profiles=None)  # type: ignore[arg-type]
    live: list[tuple[Any, ...]] = []
    for now, event, _ in driver.log:
        if event is None:
            decisions = core.tick(now)
        elif isinstance(event, (FleetObserved, ProfilesUpdated)):
            decisions = core.handle(event, now)  # the shell builds these from its views
        else:
            kind, record = as_record(event)  # type: ignore[misc]
            captured: list[Any] = []
            handle = core.handle

            def capture(ev: Any, at: float, handle: Any = handle, captured: list[Any] = captured) -> list[Any]:
                out = handle(ev, at)
                captured.extend(out)
                return out

            core.handle = capture  # type: ignore[method-assign]
            if kind == "job_submitted":  # the shell's intake counted these prompts
                core.handle(edge.job_submitted(record, list(event.prompts), None), now)
            else:
                shell.on_record(kind, record, now)
            core.handle = handle  # type: ignore[method-assign]
            decisions = captured
        live += summary(decisions)
    simulated = [s for _, _, out in driver.log for s in summary(out)]
    assert len(simulated) > 600 and live == simulated
