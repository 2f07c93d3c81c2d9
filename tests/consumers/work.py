"""Building data-plane work records and running worker processes for the integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from phaseroute.schemas import serde
from phaseroute.streams.policy.lifecycle import attempt_id
from phaseroute.streams.policy.types import Phase

REPO = Path(__file__).resolve().parents[2]
CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")
QUESTIONS = [
    "What is the capital of France?", "Name three colours of the rainbow.", "Explain what a queue is in one sentence.",
    "Write a haiku about rain.", "What is 12 times 7?", "Give me a tip for learning to cook.",
    "Why is the sky blue?", "Describe a cat in five words.", "What does a compiler do?", "List two uses of a kettle.",
]


def prompts(n: int) -> list[str]:
    """``n`` chat-templated prompts of varied lengths (a question, padded with context for some)."""
    out = []
    for i in range(n):
        q = QUESTIONS[i % len(QUESTIONS)]
        if i % 3 == 1:
            q = "Here is some context: " + " ".join(["the train left the station on time"] * (i % 7 + 1)) + ". " + q
        out.append(CHAT.format(q=q))
    return out


def prefill_work(job_id: str, index: int, prompt: str, pool: str, max_tokens: int, *, decode_pool: str | None,
                 colocated: bool, attempt: int = 0) -> dict[str, Any]:
    request_id = f"{job_id}/r{index:04d}"
    now_ms = int(time.time() * 1000)
    return {
        "attempt_id": attempt_id(request_id, Phase.PREFILL, attempt), "request_id": request_id, "job_id": job_id,
        "tenant": "tenant-a", "custom_id": f"req-{index}", "attempt": attempt, "pool": pool, "model": "smollm2-135m",
        "prompt": prompt, "prompt_tokens": len(prompt) // 4, "max_tokens": max_tokens,
        "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens, "seed": None},
        "priority": 1, "deadline": now_ms + 3_600_000, "colocated": colocated, "decode_pool": decode_pool,
        "quality_tier": "EXACT", "dispatched_at": now_ms,
    }


def produce(bootstrap: str, topic: str, records: Iterable[tuple[str, str, dict[str, Any]]]) -> int:
    """Produce (key, kind, record) triples; wait for every acknowledgement."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "partitioner": "murmur2_random"})
    n = 0
    for key, kind, record in records:
        producer.produce(topic, key=key, value=serde.encode(kind, record))
        n += 1
    assert producer.flush(30) == 0
    return n


def read_all(bootstrap: str, topic: str, expected_kind: str, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Every record on ``topic`` up to its end as of this call (the high watermark of each
    partition), read without a consumer group so no rebalance or idle gap can cut it short."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-reader-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        todo = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        records: list[dict[str, Any]] = []
        deadline = time.time() + timeout_s
        while todo:
            if time.time() > deadline:
                raise TimeoutError(f"read_all({topic}): partitions {sorted(todo)} not read to their end in {timeout_s:.0f} s")
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error() and msg.offset() < ends[msg.partition()]:
                records.append(serde.decode(msg.value(), expected_kind)[1])
            # done with a partition once the position passes its end (offsets may have gaps)
            for tp in consumer.position([TopicPartition(topic, p) for p in todo]):
                if tp.offset >= ends[tp.partition]:
                    todo.discard(tp.partition)
        return records
    finally:
        consumer.close()


def start_worker(pool: str, phase: str, *extra: str, log_dir: Path) -> subprocess.Popen:
    """A real worker process (`phaseroute worker`), logging to ``log_dir``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"{pool}-{phase}-{uuid.uuid4().hex[:6]}.log", "wb")
    cmd = [sys.executable, "-m", "phaseroute.cli.main", "worker", "--pool", pool, "--phase", phase, "--threads", "1", *extra]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def stop(proc: subprocess.Popen, timeout_s: float = 60) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(10)


def wait_until_busy(bootstrap: str, pool: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """The first heartbeat of ``pool`` reporting work in flight (a worker mid-batch)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-hb-{uuid.uuid4().hex}",
                         "auto.offset.reset": "latest", "enable.auto.commit": False})
    consumer.subscribe(["pools.heartbeat"])
    deadline = time.time() + timeout_s
    try:
        while time.time() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            beat = serde.decode(msg.value(), "pool_heartbeat")[1]
            if beat["pool"] == pool and beat["status"] == "UP" and beat["batch_in_flight"] > 0:
                return beat
    finally:
        consumer.close()
    raise AssertionError(f"no heartbeat of pool {pool!r} showed work in flight within {timeout_s:.0f} s")
