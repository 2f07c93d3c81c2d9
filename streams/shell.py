"""The control plane's shell around the control core, without Faust: records in, sends out.

Life of a job through the shell (the Faust app in ``app.py`` only moves records between Kafka
and these methods, and persists the mappings it is given):
- admission ran before, at an admission desk (``admission_desk.py``, partitioned by job across
  the instances): ``on_record`` turns its verdict from ``jobs.admissions`` into ``JobAdmitted``
  and the dispatcher's backlog takes the job; ``load`` is the dispatcher's load snapshot the desks
  judge the next jobs against;
- ``on_record`` turns every other record into its core event (``edge.py``; a job's final state
  from ``jobs.state``, where its tracker publishes it, becomes ``JobEnded``); a request read back
  from ``requests.pending`` leaves its text and sampling in ``prompts`` — the only place the text
  is kept — and ``Dispatch`` decisions read it from there to build ``prefill.<pool>`` work. The
  drift monitor's canaries come the same way (tenant ``_canary``, pinned to the path they
  measure, with their probe kept beside the text); their results come back on
  ``canary.results``.
- ``tick`` reports the pools and the profile table to the core when they changed, then runs the
  core's clock.
Every decision becomes sends here: ``Dispatch`` a ``prefill_work`` on the pool topic's partition
that ``pool_partitions.py`` chooses (balanced by tokens, the same for every attempt);
``FailRequest`` a FAILED result on ``results``; ``Forget`` drops the finished job's texts and
placements; ``Problem`` (one event or request the core could not handle) is logged and
dead-lettered with the reason, and nothing else stops.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, MutableMapping
from typing import Any

from phaseroute.infra import topics
from phaseroute.schemas.deadletter import to_dead_letter
from phaseroute.schemas.enums import DeadLetterStage, Phase
from phaseroute.streams import edge
from phaseroute.streams.admission_edge import job_admitted, load_send
from phaseroute.streams.core import (
    AttemptFailed,
    ControlCore,
    Decision,
    Dispatch,
    FailRequest,
    FleetObserved,
    Forget,
    JobChanged,
    Problem,
    ProfilesUpdated,
    QueueRequest,
)
from phaseroute.streams.core.events import Event
from phaseroute.streams.edge import Send
from phaseroute.streams.model_catalog import ModelInfo
from phaseroute.streams.policy import FailureKind
from phaseroute.streams.pool_partitions import PoolPartitioner
from phaseroute.streams.views import PoolView, ProfileView

log = logging.getLogger(__name__)

RESTORED = "control plane restored"
"""The start of the line the control plane logs once its state is read back and it serves
(what ``bench control`` and the live tests wait for)."""
SERVICE = "control"

_EVENTS: dict[str, Callable[[dict[str, Any]], Event | None]] = {
    "kv_ready": edge.kv_ready, "result": edge.result, "attempt_failed": edge.attempt_failed,
    "job_event": edge.job_ended, "job_command": edge.cancel, "job_admission": job_admitted,
}


Origin = tuple[str, int | None, int | None, dict[str, Any]]  # topic, partition, offset, record of an event


class ControlShell:
    def __init__(self, core: ControlCore, prompts: MutableMapping[str, Any], models: dict[str, ModelInfo],
                 output_file: Callable[[str, str], str | None], pools: PoolView, profiles: ProfileView) -> None:
        self.core = core
        self.prompts = prompts  # request id -> {"prompt": text, "sampling": {...}}
        self.models = models
        self.output_file = output_file
        self.pools, self.profiles = pools, profiles  # what heartbeats and the profiles topic say
        self._profiles_version: object = None
        self.partitioner = PoolPartitioner()  # which partition of a pool topic each request's work takes

    # -- everything else -----------------------------------------------------------------------
    def on_record(self, kind: str, record: dict[str, Any], now: float, origin: Origin | None = None) -> list[Send]:
        if kind == "request":
            rid = record["request_id"]
            if rid not in self.prompts and self.core.job_is_open(record["job_id"]):
                self.prompts[rid] = {"prompt": record["prompt"], "sampling": record["sampling"],
                                     "canary": record.get("canary")}
            return self.sends_of(self.core.handle(edge.request_queued(record), now), now, origin)
        event = _EVENTS[kind](record)
        if event is None:
            return []
        return self.sends_of(self.core.handle(event, now), now, origin)

    def tick(self, now: float) -> list[Send]:
        """Report the pools and the profiles, then run the core's clock."""
        return self._observe(now) + self.sends_of(self.core.tick(now), now)

    def load(self, dispatcher: str, now: float) -> Send:
        """The dispatcher's load snapshot for the admission desks (``control.load``)."""
        jobs, fair = self.core.jobs, self.core.dispatch.fair
        return load_send(jobs.backlog(), self.core.admissions_through, fair.queued_requests(), dispatcher, now,
                         self.core.fleet_rates(now))

    def _observe(self, now: float) -> list[Send]:
        """The pools as heartbeats say now, and the profile table when it changed, to the core."""
        fleet = tuple(self.pools.states(now, {}, {}).values())
        out = self.sends_of(self.core.handle(FleetObserved(fleet), now), now)
        version = self.profiles.version
        if version != self._profiles_version:
            self._profiles_version = version
            out += self.sends_of(self.core.handle(ProfilesUpdated(self.profiles.table()), now), now)
        return out

    def restore(self, now: float) -> list[Send]:
        """Rebuild the core from its tables, after telling it the fleet and the profiles."""
        return self._observe(now) + self.sends_of(self.core.restore(now), now)

    # -- decisions out -------------------------------------------------------------------------
    def sends_of(self, decisions: list[Decision], now: float, origin: Origin | None = None) -> list[Send]:
        out: list[Send] = []
        for d in decisions:
            if isinstance(d, Dispatch):
                out += self._dispatch(d, now)
            elif isinstance(d, FailRequest):  # a canary's result goes where the drift monitor reads it
                topic = topics.CANARY_RESULTS if d.work.tenant == self.core.config.canary_tenant else topics.RESULTS
                out.append(Send(topic, d.work.job_id, "result", edge.failed_result(d, now)))
            elif isinstance(d, JobChanged):
                out += edge.job_changed_sends(d, now, self.output_file)
            elif isinstance(d, Forget):
                for rid in d.request_ids:
                    self.prompts.pop(rid, None)
                self.partitioner.forget(d.request_ids)
            elif isinstance(d, Problem):
                out.append(self._problem(d, now, origin))
            elif isinstance(d, QueueRequest):
                raise AssertionError("QueueRequest comes only from submitted()")
        return out

    def _dispatch(self, d: Dispatch, now: float) -> list[Send]:
        stored = self.prompts.get(d.work.request_id)
        if stored is None:  # its text is gone (a bug, or a store lost): the attempt cannot run anywhere
            failed = AttemptFailed(d.work.request_id, d.attempt, d.prefill_pool, Phase.PREFILL, FailureKind.INVALID,
                                   "the control plane no longer has this request's prompt text")
            return self.sends_of(self.core.handle(failed, now), now)
        record = edge.prefill_work(d, stored["prompt"], stored["sampling"], now, stored.get("canary"))
        topic = topics.prefill_topic(d.prefill_pool)
        partition = self.partitioner.place(topic, d.work.request_id, d.work.prompt_tokens + d.work.max_output_tokens)
        return [Send(topic, d.work.request_id, "prefill_work", record, partition)]

    def _problem(self, p: Problem, now: float, origin: Origin | None) -> Send:
        """Log the problem and dead-letter its event (the record as JSON) with the reason."""
        log.error("control core could not handle %s: %s", p.where, p.reason)
        topic, partition, offset, record = origin if origin is not None else (f"control/{p.where}", None, None, {})
        raw = json.dumps(record, default=str).encode() if origin is not None else None
        letter = to_dead_letter(raw, None, topic, partition, offset, RuntimeError(f"{p.where}: {p.reason}"),
                                DeadLetterStage.PROCESS, SERVICE, edge.ms(now))
        return Send(topics.DEADLETTER, topic, "dead_letter", letter)
