"""The Faust app of the control plane: topics, tables, agents and the dispatch timer.

Life of a job through the agents (each agent hands its event to ``ControlPlane`` and sends
what it returns):
- ``admission`` on ``jobs.submitted`` -> ``jobs.events`` / ``jobs.state`` and ``requests.pending``
  (the job's input is read from the blob store, validated and tokenized in a worker thread,
  so a 50,000-line job does not stop the other agents and the dispatch timer);
- ``scheduler`` on ``requests.pending`` -> the ``requests`` table and the fair queues;
- ``dispatch`` timer -> ``prefill.<pool>`` (router decisions), retries, speculation, pool loss;
- ``tracker`` agents on ``kv.ready``, ``results``, ``attempts.failed`` -> progress, retries;
  ``output_written`` on ``results.written`` (the result sink's receipts) -> completion, once the
  output file holds every line; ``commands`` on ``jobs.commands`` -> cancellation.
Undecodable messages go to ``deadletter`` with the reason. Tables (``jobs``, ``requests``, and
``fairness``: each tenant's VTC counter) use ``use_partitioner`` (keys hashed like any producer
would), are changelog-backed and rebuilt from Kafka at start; then ``restore`` gives the fair
scheduler back its counters and running requests and re-queues what was pending. One control-plane process owns all partitions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from collections.abc import Iterable
from typing import Any

import faust

from phaseroute.config import Settings
from phaseroute.infra.topics import CONTROL_PARTITIONS
from phaseroute.schemas import faust_codec  # noqa: F401  (registers the phaseroute-avro codecs)
from phaseroute.schemas.faust_codec import CODEC_NAME, Undecodable
from phaseroute.streams.control import ControlConfig, ControlPlane
from phaseroute.streams.model_catalog import load_model_info
from phaseroute.streams.records import Send
from phaseroute.streams.views import PoolView, ProfileView, TopicFollower

log = logging.getLogger(__name__)
APP_ID = "phaseroute-control"


def build_app(settings: Settings, config: ControlConfig, models: tuple[str, ...] = ("smollm2-135m",),
              tick_s: float = 0.25) -> tuple[faust.App, dict[str, Any]]:
    """The Faust app and a handle dict (``control``, views) for the caller to start and inspect."""
    app = faust.App(
        APP_ID, broker=f"kafka://{settings.bootstrap_servers}", store="memory://", web_enabled=False,
        topic_partitions=CONTROL_PARTITIONS, topic_replication_factor=1, consumer_auto_offset_reset="earliest",
        datadir=str(settings.home / "faust")
    )

    def topic(name: str, kind: str) -> faust.TopicT:
        return app.topic(name, key_serializer="raw", value_serializer=f"{CODEC_NAME}.{kind}")

    jobs = app.Table("jobs", default=None, partitions=CONTROL_PARTITIONS, use_partitioner=True)
    requests = app.Table("requests", default=None, partitions=CONTROL_PARTITIONS, use_partitioner=True)
    fairness = app.Table("fairness", default=None, partitions=CONTROL_PARTITIONS, use_partitioner=True)
    profile_view, pool_view = ProfileView(), PoolView(dead_after_s=config.heartbeat_timeout_s)
    infos = {m: load_model_info(m, settings.model_cache) for m in models}
    control = ControlPlane(jobs, requests, profile_view, pool_view, infos, config, fairness=fairness)
    handle: dict[str, Any] = {"control": control, "profiles": profile_view, "pools": pool_view, "followers": [],
                              "ready": False}
    out_topics: dict[tuple[str, str], faust.TopicT] = {}
    dead = topic("deadletter", "dead_letter")

    async def send_all(sends: Iterable[Send]) -> None:
        for s in sends:
            target = out_topics.get((s.topic, s.kind))
            if target is None:
                target = out_topics[(s.topic, s.kind)] = topic(s.topic, s.kind)
            await target.send(key=s.key.encode(), value=s.record)

    def agent_for(source: str, kind: str, method: str) -> None:
        async def process(stream: Any) -> None:
            async for event in stream.events():
                while not handle["ready"]:  # the views and the restored queues come first
                    await asyncio.sleep(0.1)
                value = event.value
                if isinstance(value, Undecodable):
                    m = event.message
                    await dead.send(key=m.topic.encode(), value=value.to_dead_letter(
                        m.key, m.topic, m.partition, m.offset, f"control/{method}", int(time.time() * 1000)))
                    continue
                record = value.to_dict() if hasattr(value, "to_dict") else value
                try:
                    if method == "submit":  # reading + tokenizing the input runs off the event loop
                        scan = await asyncio.to_thread(control.scan, record)
                        await send_all(control.submit(record, time.time(), scan))
                        continue
                    await send_all(getattr(control, method)(record, time.time()))
                except Exception:  # a bad event must not kill the agent (Faust would ack it anyway)
                    log.exception("control/%s failed on %s", method, record.get("request_id") or record.get("job_id"))

        process.__name__ = f"{method}_agent"
        app.agent(topic(source, kind), name=f"{APP_ID}.{method}")(process)

    agent_for("jobs.submitted", "job_submitted", "submit")
    agent_for("requests.pending", "request", "pending")
    agent_for("kv.ready", "kv_ready", "kv_ready")
    agent_for("results", "result", "result")
    agent_for("attempts.failed", "attempt_failed", "attempt_failed")
    agent_for("results.written", "output_written", "output_written")
    agent_for("jobs.commands", "job_command", "cancel")

    def restore() -> None:
        followers = [TopicFollower(settings.bootstrap_servers, "profiles", "profile_row", profile_view.on_record),
                     TopicFollower(settings.bootstrap_servers, "pools.heartbeat", "pool_heartbeat", pool_view.on_record)]
        for follower in followers:
            follower.start()
        for follower in followers:  # admission and routing need the current profiles and pools
            follower.caught_up.wait(15)
        handle["followers"] = followers
        requeued = control.restore(time.time())
        log.info("control plane restored: %d requests re-queued from the requests table", requeued)
        handle["ready"] = True

    @app.timer(interval=tick_s)
    async def dispatch() -> None:
        if not handle["ready"]:
            if not app.tables.recovery.completed.is_set():
                return  # tables still being rebuilt from their changelogs
            restore()
        await send_all(control.tick(time.time()))

    return app, handle


def results_dir(settings: Settings) -> Path:
    return settings.results_dir
