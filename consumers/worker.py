"""Assembling worker processes: a handler, the loop, and heartbeats.

A prefill/decode/colocated worker of pool P joins the consumer group ``phaseroute.<phase>.P``
on ``prefill.P`` and/or ``decode.P``; starting another worker with the same pool and phase
splits the partitions (operators scale a pool by starting workers). Sinks run the same loop
with their own handlers. A worker started without ``threads`` uses every core this process may
run on (``machine.default_threads``); a stack with several workers on one machine gives each
its share (``machine.plan_pools``).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from phaseroute.config import Settings
from phaseroute.consumers.handler import Handler
from phaseroute.consumers.heartbeat import Heartbeat, WorkerIdentity, kv_format_of
from phaseroute.consumers.kafka_clients import LONG_POLL
from phaseroute.consumers.lag_probe import LagProbe
from phaseroute.consumers.loop import LoopConfig, WorkerLoop
from phaseroute.consumers.machine import default_threads
from phaseroute.consumers.phase_handler import KVBitflips, PhaseHandler, WorkerSpec
from phaseroute.consumers.prefill_budget import PREFILL_CHUNK_TOKENS, budget_batch_size, load_prefill_curve
from phaseroute.consumers.prefill_stage import MicroBatchLimits
from phaseroute.consumers.worker_defaults import (
    MAX_DECODE_BATCH,
    PREFILL_MAX_BATCH,
    PREFILL_MAX_BATCH_TOKENS,
    PREFILL_MAX_WAIT_S,
)
from phaseroute.infra.topics import (
    POOLS_HEARTBEAT,
    PROFILES,
    QUALITY_ALERTS,
    RESULTS,
    TELEMETRY_DRIFT,
    TELEMETRY_PHASE,
    check_pool_name,
    decode_topic,
    prefill_topic,
)

log = logging.getLogger(__name__)
PHASES = ("prefill", "decode", "both")


@dataclass(frozen=True)
class WorkerOptions:
    pool: str
    phase: str
    variant: str = "fp32"
    model: str = "smollm2-135m"
    threads: int | None = None
    device: str | None = None
    max_batch: int = PREFILL_MAX_BATCH
    max_batch_tokens: int = PREFILL_MAX_BATCH_TOKENS
    max_wait_s: float = PREFILL_MAX_WAIT_S
    max_decode_batch: int = MAX_DECODE_BATCH
    prefill_chunk_tokens: int = PREFILL_CHUNK_TOKENS  # colocated: prefill chunk (padded tokens) between decode steps
    budget_from_profile: bool = True  # size prefill micro-batches by the pool's PREFILL profile curve
    worker_id: str | None = None
    heartbeat_s: float = 2.0
    throttle_file: str | None = None  # fault injection: slowdown factor read from this file
    kv_bitflips: float = 0.0  # fault injection: flip this share of bits in handed-over KV (CRC recomputed)
    kv_bitflips_to: str | None = None  # ... only in blobs for this decode pool (None: every pool)

    def __post_init__(self) -> None:
        check_pool_name(self.pool)
        if self.phase not in PHASES:
            raise ValueError(f"phase {self.phase!r} must be one of {PHASES}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads={self.threads} must be >= 1")
        if self.prefill_chunk_tokens < 1:
            raise ValueError(f"prefill_chunk_tokens={self.prefill_chunk_tokens} must be >= 1")


def worker_id_for(pool: str, phase: str) -> str:
    return f"{pool}.{phase}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


def worker_topics(pool: str, phase: str) -> dict[str, str]:
    topics = {}
    if phase in ("prefill", "both"):
        topics[prefill_topic(pool)] = "prefill_work"
    if phase in ("decode", "both"):
        topics[decode_topic(pool)] = "decode_work"
    return topics


def build_phase_worker(settings: Settings, opts: WorkerOptions, executor: Any = None) -> tuple[WorkerLoop, Heartbeat]:
    """The loop and heartbeat of one prefill/decode/colocated worker (not started)."""
    from phaseroute.engine.kv_store import open_store
    from phaseroute.engine.registry import build_executor

    threads = opts.threads or default_threads()
    executor = executor or build_executor(opts.model, opts.variant, threads=threads, device=opts.device)
    if opts.throttle_file:
        from pathlib import Path

        from phaseroute.engine.throttle import ThrottledExecutor

        executor = ThrottledExecutor(executor, Path(opts.throttle_file))
    worker_id = opts.worker_id or worker_id_for(opts.pool, opts.phase)
    efficient_batch = None
    if opts.phase in ("prefill", "both") and opts.budget_from_profile:
        curve = load_prefill_curve(settings.bootstrap_servers, PROFILES, executor.model_name, opts.pool, opts.variant)
        efficient_batch = budget_batch_size(curve)
        log.info("prefill token budget: efficient batch %s from the profile curve %s", efficient_batch, curve)
    spec = WorkerSpec(
        pool=opts.pool, worker_id=worker_id, variant=opts.variant,
        prefill=opts.phase in ("prefill", "both"), decode=opts.phase in ("decode", "both"),
        limits=MicroBatchLimits(opts.max_batch, opts.max_batch_tokens, opts.max_wait_s),
        max_decode_batch=opts.max_decode_batch, prefill_chunk_tokens=opts.prefill_chunk_tokens,
        efficient_prefill_batch=efficient_batch,
        kv_bitflips=KVBitflips(opts.kv_bitflips, opts.kv_bitflips_to) if opts.kv_bitflips > 0 else None,
    )
    handler = PhaseHandler(executor, open_store(settings.kv_store), spec)
    config = LoopConfig(
        bootstrap=settings.bootstrap_servers, group_id=f"phaseroute.{opts.phase}.{opts.pool}", client_id=worker_id,
        topic_kinds=worker_topics(opts.pool, opts.phase), service=f"{opts.phase}-worker/{opts.pool}",
    )
    identity = WorkerIdentity(opts.pool, worker_id, opts.phase.upper(), opts.variant, (executor.model_name,),
                              device=getattr(getattr(executor, "config", None), "device", "cpu"),
                              kv_format=kv_format_of(executor))
    return _with_heartbeat(config, handler, identity, opts.heartbeat_s)


def _with_heartbeat(config: LoopConfig, handler: Handler, identity: WorkerIdentity, interval_s: float) -> tuple[WorkerLoop, Heartbeat]:
    loop = WorkerLoop(config, handler)
    probe = LagProbe(loop.consumer_lag, interval_s, name=f"lag-{identity.worker_id}")  # off the work loop

    def numbers() -> dict[str, Any]:
        return {**handler.status(), "consumer_lag": probe.lag, "queue_depth": probe.lag + handler.in_flight()}

    return loop, Heartbeat(loop.producer, identity, numbers, interval_s, lag_probe=probe)


def run(loop: WorkerLoop, heartbeat: Heartbeat | None) -> None:
    """Run until SIGTERM/SIGINT; then drain, commit, say DOWN and close."""
    loop.install_signal_handlers()
    if heartbeat is not None:
        heartbeat.start()
    server = getattr(loop, "query_server", None)
    if server is not None:
        server.start()
    try:
        loop.run()
    finally:
        if server is not None:
            server.stop()
        if heartbeat is not None:
            heartbeat.stop()
        loop.producer.flush_or_raise(30)


def build_result_sink(settings: Settings, group_suffix: str = "") -> WorkerLoop:
    from phaseroute.consumers.result_sink import ResultSinkHandler
    from phaseroute.infra.blobstore import open_blob_store

    client_id = f"result-sink.{os.getpid()}"
    handler = ResultSinkHandler(open_blob_store(settings.blob_store), writer=client_id)
    config = LoopConfig(
        bootstrap=settings.bootstrap_servers, group_id="phaseroute.result-sink" + group_suffix,
        client_id=client_id, topic_kinds={RESULTS: "result"}, service="result-sink",
        consumer_overrides=dict(LONG_POLL),
    )
    return WorkerLoop(config, handler)


def build_telemetry_sink(settings: Settings, group_suffix: str = "", profiles: bool = True) -> WorkerLoop:
    """The telemetry service: the sink loop, plus (started with it) the read-only SQL server
    that answers for the embedded chdb this process owns (``loop.query_server``) and, unless
    ``profiles`` is False, the profile builder that publishes the ``profiles`` topic from the
    loop's ticks every few seconds (``loop.profile_builder``)."""
    from phaseroute.consumers.query_server import LockedClient, QueryServer
    from phaseroute.consumers.telemetry_sink import TelemetrySinkHandler
    from phaseroute.infra.clickhouse import apply_ddl, connect
    from phaseroute.streams.profiles.builder import service_builder

    client = LockedClient(connect(settings))
    apply_ddl(client, settings.clickhouse_database)
    handler = TelemetrySinkHandler(client, settings.clickhouse_database)
    config = LoopConfig(
        bootstrap=settings.bootstrap_servers, group_id="phaseroute.telemetry-sink" + group_suffix,
        client_id=f"telemetry-sink.{os.getpid()}",
        topic_kinds={TELEMETRY_PHASE: "phase_telemetry", POOLS_HEARTBEAT: "pool_heartbeat",
                     TELEMETRY_DRIFT: "drift_measurement", QUALITY_ALERTS: "quality_alert"},
        service="telemetry-sink", max_poll=1000,  # small records: take many per poll
        consumer_overrides=dict(LONG_POLL),
    )
    builder = service_builder(client, settings.bootstrap_servers, settings.clickhouse_database) if profiles else None
    loop = WorkerLoop(config, handler, on_tick=builder.on_tick if builder else None)
    loop.query_server = QueryServer(client, settings.telemetry_port, settings)  # type: ignore[attr-defined]
    loop.profile_builder = builder  # type: ignore[attr-defined]
    return loop
