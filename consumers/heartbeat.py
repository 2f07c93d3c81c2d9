"""Worker heartbeats: who is alive in which pool, how much work waits, how much memory is used.

Every ``interval_s`` a worker publishes a ``pool_heartbeat`` record (key worker_id) to
``pools.heartbeat``: pool, phase, variant, consumer lag (from the broker's watermarks, not
estimated), batch in flight, memory in use. The control plane declares a worker dead when
its heartbeats stop for a few intervals, and a pool dead when all its workers are; a final
heartbeat with status DOWN is sent on a clean shutdown.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from phaseroute.consumers.kafka_clients import TrackedProducer
from phaseroute.consumers.lag_probe import LagProbe
from phaseroute.infra.topics import POOLS_HEARTBEAT
from phaseroute.schemas import serde


def kv_format_of(executor: Any) -> str | None:
    """The KV layout an executor writes and reads: ``model|dtype|layers x heads x dim|vN``. Two
    pools may hand a KV cache over only when these are equal (the router's pair filter)."""
    from phaseroute.engine.protocol import KV_LAYOUT_VERSION

    try:
        shape = f"{executor.num_layers}x{executor.kv_heads}x{executor.head_dim}"
        return f"{executor.model_name}|{executor.config.dtype}|{shape}|v{KV_LAYOUT_VERSION}"
    except AttributeError:
        return None  # an executor without a KV cache of this kind


@dataclass(frozen=True)
class WorkerIdentity:
    pool: str
    worker_id: str
    phase: str  # PREFILL, DECODE or BOTH
    variant: str
    models: tuple[str, ...]
    device: str = "cpu"
    kv_format: str | None = None


class Heartbeat:
    """Publishes heartbeats from a background thread; numbers come from ``read_status``."""

    def __init__(
        self, producer: TrackedProducer, identity: WorkerIdentity, read_status: Callable[[], dict[str, Any]],
        interval_s: float = 2.0, lag_probe: LagProbe | None = None,
    ) -> None:
        self.producer = producer
        self.lag_probe = lag_probe  # started and stopped with the heartbeat
        self.identity = identity
        self.read_status = read_status
        self.interval_s = interval_s
        self.started_at = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{identity.worker_id}", daemon=True)

    def start(self) -> None:
        if self.lag_probe is not None:
            self.lag_probe.start()
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and send a last heartbeat saying DOWN."""
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 1)
        if self.lag_probe is not None:
            self.lag_probe.stop()
        self.beat(status="DOWN")
        self.producer.flush_or_raise(10)

    def _run(self) -> None:
        self.beat(status="UP")
        while not self._stop.wait(self.interval_s):
            self.beat(status="UP")

    def record(self, status: str) -> dict[str, Any]:
        numbers = self.read_status()
        ident = self.identity
        return {
            "pool": ident.pool, "worker_id": ident.worker_id, "phase": ident.phase, "variant": ident.variant,
            "device": ident.device, "models": list(ident.models),
            "queue_depth": int(numbers.get("queue_depth", 0)), "consumer_lag": int(numbers.get("consumer_lag", 0)),
            "batch_in_flight": int(numbers.get("batch_in_flight", 0)), "max_batch": int(numbers.get("max_batch", 0)),
            "memory_bytes": int(numbers.get("memory_bytes") or psutil.Process().memory_info().rss),
            "kv_free_bytes": int(numbers.get("kv_free_bytes", 0)),
            "kv_capacity_bytes": None if numbers.get("kv_capacity_bytes") is None else int(numbers["kv_capacity_bytes"]),
            "kv_format": ident.kv_format,
            "host": socket.gethostname(), "pid": os.getpid(), "status": status,
            "started_at": int(self.started_at * 1000), "interval_s": self.interval_s, "at": int(time.time() * 1000),
        }

    def beat(self, status: str = "UP") -> None:
        self.producer.produce(POOLS_HEARTBEAT, self.identity.worker_id, serde.encode("pool_heartbeat", self.record(status)))
