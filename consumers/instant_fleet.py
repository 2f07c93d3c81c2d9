"""A FAKE fleet of instant workers, for measuring the control plane alone (``bench control``).

It is not hardware and runs no model: each fake pool is announced the way real pools are
(heartbeats on ``pools.heartbeat``, profile rows on ``profiles`` with a very high measured
throughput, so admission finds every deadline feasible), and one consumer thread answers every
work record on ``prefill.<pool>`` at once with an OK ``result`` of one token. What is measured
is then the control plane's own work: admission, the fair queues, the router, the tracking of
results and receipts — real Kafka, the real control plane, the real result sink.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import Counter
from typing import Any

from confluent_kafka import Consumer, Producer

from phaseroute.infra.provision import provision
from phaseroute.infra.topics import POOLS_HEARTBEAT, PROFILES, RESULTS, pool_topics, prefill_topic
from phaseroute.schemas import serde
from phaseroute.streams.policy import CurvePoint, Phase, ProfileRow, ProfileSource
from phaseroute.streams.profiles.convert import row_to_avro

MODEL = "smollm2-135m"
KV_FORMAT = "fake-instant|v1"


def _ms(t: float) -> int:
    return int(t * 1000)


class InstantFleet:
    """``pools`` fake colocated pools of one worker each (see the module docstring)."""

    def __init__(self, bootstrap: str, pools: int = 4, max_batch: int = 256, prefix: str = "fake-instant") -> None:
        self.bootstrap = bootstrap
        self.pools = [f"{prefix}-{k}" for k in range(pools)]
        self.max_batch = max_batch
        self.answered = 0
        self.first_work_at: float | None = None
        self.last_work_at: float | None = None
        self.longest_idle_s = 0.0  # the longest time without work between the first and the last work record
        self.work_per_s: Counter[int] = Counter()  # work records answered, by the second (epoch) they came in
        self._stop = threading.Event()
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 4})
        self._threads = [threading.Thread(target=self._announce, daemon=True, name="fake-fleet-announce"),
                         threading.Thread(target=self._answer, daemon=True, name="fake-fleet-answer")]

    def start(self) -> None:
        provision(self.bootstrap, [spec for pool in self.pools for spec in pool_topics(pool)])
        self._publish_profiles(time.time())
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        self._producer.flush(10)

    # -- what real pools announce -----------------------------------------------------------
    def _publish_profiles(self, now: float) -> None:
        for pool in self.pools:
            for phase in (Phase.PREFILL, Phase.DECODE):
                row = ProfileRow(MODEL, phase, pool, "fp32", (CurvePoint(1, 1e6), CurvePoint(self.max_batch, 1e7)),
                                 0.001, 0.001, 0.001, 46080.0, 46080.0, 0.0, 1.0, 10_000, now, ProfileSource.PROFILER)
                key = f"{MODEL}|{phase.name}|{pool}|fp32"
                self._producer.produce(PROFILES, key=key.encode(), value=serde.encode("profile_row", row_to_avro(row, 60.0)))
        self._producer.flush(10)

    def _heartbeat(self, pool: str, now: float) -> dict[str, Any]:
        return {"pool": pool, "worker_id": f"{pool}-0", "phase": "BOTH", "variant": "fp32", "device": "fake",
                "models": [MODEL], "queue_depth": 0, "consumer_lag": 0, "batch_in_flight": 0, "max_batch": self.max_batch,
                "memory_bytes": 10**9, "kv_free_bytes": 64 * 10**9, "kv_capacity_bytes": 64 * 10**9, "kv_format": KV_FORMAT,
                "host": socket.gethostname(), "pid": os.getpid(), "status": "UP", "started_at": _ms(now - 60),
                "interval_s": 1.0, "at": _ms(now)}

    def _announce(self) -> None:
        last_profiles = time.time()
        while not self._stop.is_set():
            now = time.time()
            for pool in self.pools:
                self._producer.produce(POOLS_HEARTBEAT, key=f"{pool}-0".encode(),
                                       value=serde.encode("pool_heartbeat", self._heartbeat(pool, now)))
            if now - last_profiles > 20:  # fresh rows: the router guards against stale ones
                self._publish_profiles(now)
                last_profiles = now
            self._producer.poll(0)
            self._stop.wait(1.0)

    # -- what real workers do, instantly ------------------------------------------------------
    def _answer(self) -> None:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "phaseroute.both.fake-instant",
                             "auto.offset.reset": "latest", "enable.auto.commit": True, "log_level": 4})
        consumer.subscribe([prefill_topic(p) for p in self.pools])
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(500, 0.2):
                    value = msg.value()
                    if msg.error() or value is None:
                        continue
                    _, work = serde.decode(value)
                    self._producer.produce(RESULTS, key=work["job_id"].encode(),
                                           value=serde.encode("result", self._result(work)))
                    self._count(time.time())
                self._producer.poll(0)
        finally:
            consumer.close()

    def _count(self, now: float) -> None:
        if self.last_work_at is not None:
            self.longest_idle_s = max(self.longest_idle_s, now - self.last_work_at)
        self.answered += 1
        self.work_per_s[int(now)] += 1
        self.last_work_at = now
        self.first_work_at = self.first_work_at or now

    def work_per_window(self, since: float, until: float, window_s: float = 10.0) -> list[int]:
        """Work records answered in each ``window_s`` from ``since`` to ``until`` (whole seconds)."""
        windows = [0] * max(1, int((until - since) // window_s) + 1)
        for second, n in list(self.work_per_s.items()):  # a copy: the answering thread may still add
            if since <= second <= until:
                windows[int((second - since) // window_s)] += n
        return windows

    @staticmethod
    def _result(work: dict[str, Any]) -> dict[str, Any]:
        return {
            "request_id": work["request_id"], "job_id": work["job_id"], "tenant": work["tenant"],
            "custom_id": work["custom_id"], "attempt_id": work["attempt_id"], "attempt": work["attempt"],
            "model": work["model"], "status": "OK", "output_text": "x", "output_token_ids": [1],
            "finish_reason": "LENGTH", "prompt_tokens": work["prompt_tokens"], "completion_tokens": 1,
            "prefill_pool": work["pool"], "decode_pool": work["pool"], "colocated": True, "prefill_time_s": 0.0,
            "decode_time_s": 0.0, "kv_transfer_s": 0.0, "kv_bytes": 0, "error": None, "completed_at": _ms(time.time()),
            "canary": None, "canary_trace": None,
        }
