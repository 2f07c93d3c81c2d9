"""The Faust app of the control plane: a thin shell that feeds Kafka records to the control core.

Life of a job through the agents (each hands its record to ``ControlShell``, which asks the
pure ``ControlCore`` and returns what to send):
- admission runs before, at the admission desks of every instance (``admitter.py``, partitioned
  by job id): ``admitted`` on ``jobs.admissions`` -> the dispatcher's backlog takes each desk's verdict; the
  ``publish_load`` timer (every second) sends the dispatcher's load snapshot the desks judge
  against to ``control.load``;
- ``pending`` on ``requests.pending`` -> the fair queues (the text goes to the ``prompts`` table);
- the ``dispatch`` timer (every ``tick_s``) -> ``prefill.<pool>`` work, retries, speculative
  copies, work of dead pools placed again, jobs done with leaving;
- ``kv_ready``, ``result``, ``attempt_failed`` on ``kv.ready``, ``results``, ``attempts.failed``;
  ``job_ended`` on ``jobs.state``: a job's final state from its tracker (``tracking_loop.py``,
  partitioned by job id across the instances, which takes the sink's receipts and cancels and
  completes or expires jobs) -> a cancelled or expired job's open requests fail, a whole job's
  requests are forgotten; ``cancel`` on ``jobs.commands`` (a drift canary round's withdrawal);
  ``canary_result`` on ``canary.results`` (the drift monitor's canaries, released by the fair
  scheduler like any tenant's work, end there).
Undecodable records, and records the core could not handle, go to ``deadletter`` with the
reason; an exception in an agent or in the timer is logged and dead-lettered and the agent goes
on (Faust would otherwise ack the event silently, or stop the app from a timer). The core's
state lives in changelog-backed tables (``jobs``, ``requests``, ``tenants``; ``prompts`` holds
each request's text once), written behind: ``flush_state`` every second and before each offset
commit (``faust_fixes``), so a committed event's changes are in them; after a restart the tables are rebuilt from Kafka and ``restore``
rebuilds the core from them, without blocking the event loop while the profile and pool views
catch up. One dispatcher at a time: this app runs only in the instance that holds the control
lease (``infra/control_lease.py``, started by ``phaseroute control``), and a standby takes over
from these same tables when it dies, warm: it kept a copy of them (``warm_tables.py``).
Admission and job tracking are partitioned across the instances; the requests' attempts
(results, KV ready, failures, retries) are followed here, beside the dispatcher.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import faust

from phaseroute.config import Settings
from phaseroute.infra import topics
from phaseroute.infra.blobstore import output_prefix
from phaseroute.infra.kafka_security import faust_credentials
from phaseroute.infra.topic_follower import TopicFollower
from phaseroute.infra.topics import CONTROL_PARTITIONS
from phaseroute.schemas import faust_codec  # noqa: F401  (registers the phaseroute-avro codecs)
from phaseroute.schemas.deadletter import to_dead_letter
from phaseroute.schemas.enums import DeadLetterStage
from phaseroute.schemas.faust_codec import CODEC_NAME, Undecodable
from phaseroute.streams import warm_tables
from phaseroute.streams.core import ControlCore
from phaseroute.streams.edge import Send, ms
from phaseroute.streams.faust_fixes import (
    drain_table_writes_before_commits,
    fetch_in_small_slices,
    hold_until_ready,
    keep_changelog_partitions_known,
    read_uncommitted_partitions_from_the_start,
)
from phaseroute.streams.model_catalog import ModelInfo, load_model_info
from phaseroute.streams.settings import core_config
from phaseroute.streams.shell import RESTORED, ControlShell
from phaseroute.streams.tick_stats import TickStats
from phaseroute.streams.views import PoolView, ProfileView

log = logging.getLogger(__name__)
APP_ID = topics.CONTROL_APP_ID
CATCH_UP_S = 15.0  # how long a (re)start waits for the profile and pool views before it dispatches anyway
LOAD_EVERY_S = 1.0  # how often the dispatcher's load snapshot goes to the admission desks
FLUSH_EVERY_S = 1.0  # how often the core's changed state is written to its tables without a commit
FETCH_BYTES = 65_536  # per partition, once restored: a big job's pending requests do not hold the results back
SERVED_MODELS = ("smollm2-135m",)  # the models the control plane admits jobs for

# (topic, Avro kind, agent name): every topic the control plane reads
_INPUTS = (
    (topics.JOBS_ADMISSIONS, "job_admission", "admitted"),
    (topics.REQUESTS_PENDING, "request", "pending"), (topics.KV_READY, "kv_ready", "kv_ready"),
    (topics.RESULTS, "result", "result"), (topics.ATTEMPTS_FAILED, "attempt_failed", "attempt_failed"),
    (topics.JOBS_STATE, "job_event", "job_ended"), (topics.JOBS_COMMANDS, "job_command", "cancel"),
    (topics.CANARY_RESULTS, "result", "canary_result"),
)


@dataclass
class TableStore:
    """The core's store in Faust tables (changelog-backed, rebuilt from Kafka at start)."""

    jobs: MutableMapping[str, Any]
    requests: MutableMapping[str, Any]
    tenants: MutableMapping[str, Any]
    enabled: bool = True


def build_app(settings: Settings, tenants_file: Path | None = None, models: tuple[str, ...] = SERVED_MODELS,
              tenant_records: Iterable[Mapping[str, Any]] = (), infos: Mapping[str, ModelInfo] | None = None,
              instance: str = "control", views: tuple[PoolView, ProfileView, list[TopicFollower]] | None = None,
              warm: bool = False, **overrides: Any) -> tuple[faust.App, dict[str, Any]]:
    """The Faust app and a handle dict (``shell``, ``core``, views) for the caller to inspect.
    Tenants come from the registry's records (and a YAML file of them); ``infos``: the models'
    catalogue entries when the caller loaded them already (a standby does, before it waits);
    ``instance``: this instance's id (it signs the load snapshots); ``views``: the pool and
    profile views and their running followers when the caller keeps them warm already (the
    instance's admission desk does, so a standby that takes over has them caught up); ``warm``:
    the tables start from the copy a ``warm_tables.ChangelogMirror`` handed over (recovery reads
    only what was written after it); ``overrides`` are ``CoreConfig`` fields (tests shorten
    timeouts with them)."""
    if infos is None:
        infos = {m: load_model_info(m, settings.model_cache) for m in models}
    infos = dict(infos)
    config = core_config(infos, tenants_file, tenant_records, **overrides)
    app = faust.App(
        APP_ID, broker=f"kafka://{settings.bootstrap_servers}", broker_credentials=faust_credentials(settings.kafka_client_config), store="memory://",
        web_enabled=False,
        topic_partitions=CONTROL_PARTITIONS, topic_replication_factor=1, consumer_auto_offset_reset="earliest",
        datadir=str(settings.home / "faust"),
        # a standby takes over once the dead instance's session expired (infra/control_lease.py):
        # its Faust consumer gets the partitions when the dead one's Faust session expired too
        broker_session_timeout=settings.control_session_timeout_s,
        broker_heartbeat_interval=min(3.0, settings.control_session_timeout_s / 5),
        broker_request_timeout=max(90.0, settings.control_session_timeout_s + 30.0),  # Faust: >= the session
    )

    def topic(name: str, kind: str) -> faust.TopicT:
        return app.topic(name, key_serializer="raw", value_serializer=f"{CODEC_NAME}.{kind}")

    def table(name: str) -> Any:
        return app.Table(name, default=None, partitions=CONTROL_PARTITIONS, use_partitioner=True,
                         store=warm_tables.STORE_URL if warm else None)

    assert topics.CONTROL_TABLES == ("jobs", "requests", "tenants", "prompts")  # provisioned changelogs
    store = TableStore(table("jobs"), table("requests"), table("tenants"))
    prompts = table("prompts")
    # the core writes its tables before each offset commit and every FLUSH_EVERY_S, not after every event
    core = ControlCore(config, store, write_behind=True)
    drain_table_writes_before_commits(app, write_state=core.flush)
    read_uncommitted_partitions_from_the_start(app)
    keep_changelog_partitions_known(app)
    if views is not None:
        pool_view, profile_view, followed = views
    else:
        profile_view, pool_view, followed = ProfileView(), PoolView(dead_after_s=config.heartbeat_timeout_s), []
    shell = ControlShell(core, prompts, infos, output_prefix, pool_view, profile_view)
    handle: dict[str, Any] = {"shell": shell, "core": core, "profiles": profile_view, "pools": pool_view,
                              "followers": [], "ready": False, "restoring": False}
    out_topics: dict[tuple[str, str], faust.TopicT] = {}
    dead = topic(topics.DEADLETTER, "dead_letter")

    async def send_all(sends: Iterable[Send]) -> None:
        for s in sends:
            target = out_topics.get((s.topic, s.kind))
            if target is None:
                target = out_topics[(s.topic, s.kind)] = topic(s.topic, s.kind)
            await target.send(key=s.key.encode(), value=s.record, partition=s.partition)

    async def dead_letter(message: Any, record: Any, where: str, exc: BaseException) -> None:
        raw = json.dumps(record, default=str).encode() if record is not None else None
        await dead.send(key=str(message.topic).encode(), value=to_dead_letter(
            raw, message.key, message.topic, message.partition, message.offset, exc, DeadLetterStage.PROCESS,
            f"control/{where}", ms(time.time())))

    def agent_for(source: str, kind: str, name: str) -> None:
        async def process(stream: Any) -> None:
            async for event in stream.events():
                await hold_until_ready(app, event, lambda: bool(handle["ready"]))  # the views and the restored core first
                m, value = event.message, event.value
                if isinstance(value, Undecodable):
                    await dead.send(key=m.topic.encode(), value=value.to_dead_letter(
                        m.key, m.topic, m.partition, m.offset, f"control/{name}", ms(time.time())))
                    continue
                record = value.to_dict() if hasattr(value, "to_dict") else value
                try:
                    await send_all(shell.on_record(kind, record, time.time(), (m.topic, m.partition, m.offset, record)))
                except Exception as exc:  # one bad event must not stop the agent
                    log.exception("control/%s failed on %s", name, m.key)
                    await dead_letter(m, record, name, exc)

        process.__name__ = f"{name}_agent"
        app.agent(topic(source, kind), name=f"{APP_ID}.{name}")(process)

    for source, kind, name in _INPUTS:
        agent_for(source, kind, name)

    async def learn_changelogs() -> None:
        """Table writes pick their changelog partition from the producer's metadata, which knows a
        topic only once asked, and only once it exists: ask for every changelog until each has its
        partitions (provisioning creates them; a restore is tried again next tick otherwise)."""
        producer = cast(Any, app.producer)._ensure_producer()  # the aiokafka producer Faust drives
        for t in app.tables.values():
            name = t.changelog_topic.get_topic_name()
            parts = await producer.partitions_for(name)
            if not parts:
                raise RuntimeError(f"changelog topic {name} has no partitions yet (provision it: `phaseroute up`)")

    async def restore() -> None:
        """Start the views, wait (without blocking the loop) until they caught up, rebuild the core."""
        await learn_changelogs()
        followers = followed or [
            TopicFollower(settings.bootstrap_servers, topics.PROFILES, "profile_row", profile_view.on_record),
            TopicFollower(settings.bootstrap_servers, topics.POOLS_HEARTBEAT, "pool_heartbeat", pool_view.on_record)]
        if not followed:
            for follower in followers:
                await asyncio.get_running_loop().run_in_executor(None, follower.start)
        handle["followers"] = followers
        waited = 0.0
        while waited < CATCH_UP_S and not all(f.caught_up.is_set() for f in followers):
            await asyncio.sleep(0.1)
            waited += 0.1
        fetch_in_small_slices(app, FETCH_BYTES)
        now = time.time()
        sends = shell.restore(now)
        log.info("%s: %d requests, %d jobs from the tables; %d final results sent again", RESTORED,
                 len(core.dispatch.requests), len(core.jobs.jobs), len(sends))
        await send_all(sends)
        handle["ready"] = True

    ticks = TickStats()

    @app.timer(interval=LOAD_EVERY_S)  # type: ignore[untyped-decorator]  # Faust's decorators are untyped
    async def publish_load() -> None:
        """The dispatcher's load for the admission desks (they judge only against a fresh one)."""
        if handle["ready"]:
            try:
                await send_all([shell.load(instance, time.time())])
            except Exception:  # a failed publish must not stop the app: the next one runs
                log.exception("control/publish_load failed")

    @app.timer(interval=FLUSH_EVERY_S)  # type: ignore[untyped-decorator]
    async def flush_state() -> None:
        """The core's state changed by ticks alone (dispatches, expiries, forgets) reaches the
        tables though no input is read (a commit writes it too, before the offsets it commits)."""
        if handle["ready"]:
            try:
                core.flush()
            except Exception:  # a failed write must not stop the app: the next one writes it
                log.exception("control/flush_state failed")

    @app.timer(interval=config.tick_s)  # type: ignore[untyped-decorator]
    async def dispatch() -> None:
        try:
            if not handle["ready"]:
                if not handle["restoring"] and cast(Any, app.tables).recovery.completed.is_set():
                    handle["restoring"] = True
                    try:
                        await restore()
                    finally:
                        handle["restoring"] = handle["ready"]  # a failed restore is tried again next tick
                return
            while True:  # a tick releases a bounded slice; the rest goes after yielding to the loop
                started = time.perf_counter()
                sends = shell.tick(time.time())
                elapsed = time.perf_counter() - started
                ticks.add(time.time(), elapsed, core.dispatch.fair.queued_requests())
                await send_all(sends)
                if not core.more_to_release:
                    break
                await asyncio.sleep(0)
        except Exception:  # a failing tick must not stop the app: the next one runs
            log.exception("control/dispatch tick failed")

    return app, handle
