"""``phaseroute pools`` on the real broker: liveness from heartbeats produced here, lag from a
consumer group committed here, throughput from telemetry produced here (test topics)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import typer
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from typer.testing import CliRunner

from phaseroute.cli.pools_cmd import Sources, collect, pools
from phaseroute.schemas import serde

pytestmark = pytest.mark.kafka


def _heartbeat(pool: str, worker: str, phase: str, age_s: float, now: float, status: str = "UP", interval_s: float = 2.0) -> dict:
    return {
        "pool": pool, "worker_id": worker, "phase": phase, "variant": "fp32", "device": "cpu", "models": ["m"],
        "queue_depth": 0, "consumer_lag": 0, "batch_in_flight": 0, "max_batch": 8, "memory_bytes": 1, "kv_free_bytes": 1,
        "host": "h", "pid": 1, "status": status, "started_at": int((now - 600) * 1000), "interval_s": interval_s,
        "at": int((now - age_s) * 1000),
    }


def _telemetry(pool: str, worker: str, n: int, age_s: float, now: float, status: str = "OK") -> dict:
    return {
        "batch_id": f"{worker}/{n}", "pool": pool, "worker_id": worker, "model": "m", "phase": "PREFILL", "variant": "fp32",
        "batch_size": 4, "tokens_in": 600, "tokens_out": 4, "seq_len_mean": 150.0, "seq_len_max": 200, "queue_wait_s": 0.0,
        "exec_time_s": 1.0, "steps": 1, "step_latency_s": 1.0, "step_latency_s_max": 1.0, "kv_bytes": 0,
        "kv_transfer_s": 0.0, "source_pool": None, "status": status, "error_class": None if status == "OK" else "Boom",
        "at": int((now - age_s) * 1000),
    }


@pytest.fixture()
def fleet(bootstrap: str, make_topic: Callable[..., str]) -> Iterator[dict[str, Any]]:
    """Pool P: one live and one silent prefill worker, 8 queued messages of which the group
    committed 2, prefill telemetry; pool Q: a silent worker and one that said DOWN."""
    p, q = f"zp{uuid.uuid4().hex[:8]}", f"zq{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    work = f"prefill.{p}"
    admin.create_topics([NewTopic(work, 2, 1)])[work].result(timeout=30)
    hb_topic, tel_topic = make_topic("heartbeat"), make_topic("telemetry")
    now = time.time()
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "partitioner": "murmur2_random"})
    for partition, count in ((0, 5), (1, 3)):
        for i in range(count):
            producer.produce(work, value=b"queued", key=f"r{i}", partition=partition)
    beats = [_heartbeat(p, "p-w1", "PREFILL", 1, now), _heartbeat(p, "p-w2", "PREFILL", 24, now),
             _heartbeat(p, "p-w2", "PREFILL", 20, now), _heartbeat(q, "q-w3", "DECODE", 30, now, interval_s=5.0),
             _heartbeat(q, "q-w4", "DECODE", 2, now, status="DOWN")]
    for hb in beats:
        producer.produce(hb_topic, key=hb["worker_id"], value=serde.encode("pool_heartbeat", hb))
    for n, (age, status) in enumerate(((10, "OK"), (30, "OK"), (5, "ERROR"), (100, "OK"))):
        producer.produce(tel_topic, key=p, value=serde.encode("phase_telemetry", _telemetry(p, "p-w1", n, age, now, status)))
    assert producer.flush(30) == 0
    group = f"phaseroute.prefill.{p}"
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    committer.commit(offsets=[TopicPartition(work, 0, 2)], asynchronous=False)
    committer.close()
    yield {"p": p, "q": q, "hb": hb_topic, "tel": tel_topic, "now": now}
    admin.delete_topics([work])[work].result(timeout=30)
    admin.delete_consumer_groups([group])[group].result(timeout=30)


def _check(reports: list[dict[str, Any]], fleet: dict[str, Any]) -> None:
    by_key = {(r["pool"], r["phase"]): r for r in reports}
    assert set(by_key) == {(fleet["p"], "prefill"), (fleet["q"], "decode")}
    p, q = by_key[(fleet["p"], "prefill")], by_key[(fleet["q"], "decode")]
    assert (p["alive"], p["workers_alive"]) == (True, 1)
    assert {w["worker_id"]: w["alive"] for w in p["workers"]} == {"p-w1": True, "p-w2": False}
    assert p["lag"] == 3 + 3 and p["lag_by_topic"] == {f"prefill.{fleet['p']}": 6}
    assert p["tokens_per_s"] == pytest.approx(1200 / 60) and (p["batches"], p["errors"]) == (2, 1)
    assert (q["alive"], q["workers_alive"], q["lag"], q["tokens_per_s"]) == (False, 0, None, 0.0)
    assert {w["worker_id"]: w["status"] for w in q["workers"]} == {"q-w3": "UP", "q-w4": "DOWN"}


def test_collect_reports_alive_dead_lag_and_throughput(bootstrap: str, fleet: dict[str, Any]) -> None:
    src = Sources(bootstrap, fleet["hb"], fleet["tel"])
    _check(collect(src, time.time(), 60.0, [fleet["p"], fleet["q"]]), fleet)


def test_pools_json_command(bootstrap: str, fleet: dict[str, Any]) -> None:
    app = typer.Typer()
    app.command("pools")(pools)
    app.command("other")(lambda: None)  # two commands, so "pools" is a subcommand as in phaseroute
    args = ["pools", "--json", "--pool", fleet["p"], "--pool", fleet["q"], "--heartbeat-topic", fleet["hb"],
            "--telemetry-topic", fleet["tel"]]
    result = CliRunner().invoke(app, args, env={"PHASEROUTE_BOOTSTRAP_SERVERS": bootstrap})
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["window_s"] == 60.0
    _check(answer["pools"], fleet)
