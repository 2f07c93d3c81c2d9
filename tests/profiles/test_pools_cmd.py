"""``phaseroute pools`` on the real broker: liveness from heartbeats produced here, lag from a
consumer group committed here, throughput from telemetry produced here (test topics)."""

from __future__ import annotations

import functools
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
    refused: list[str] = []
    produce = functools.partial(  # every record's delivery is checked
        producer.produce, on_delivery=lambda err, msg: refused.append(f"{msg.topic()}: {err}") if err else None)
    for partition, count in ((0, 5), (1, 3)):
        for i in range(count):
            produce(work, value=b"queued", key=f"r{i}", partition=partition)
    beats = [_heartbeat(p, "p-w1", "PREFILL", 1, now), _heartbeat(p, "p-w2", "PREFILL", 24, now),
             _heartbeat(p, "p-w2", "PREFILL", 20, now), _heartbeat(q, "q-w3", "DECODE", 30, now, interval_s=5.0),
             _heartbeat(q, "q-w4", "DECODE", 2, now, status="DOWN")]
    for hb in beats:
        produce(hb_topic, key=hb["worker_id"], value=serde.encode("pool_heartbeat", hb))
    for n, (age, status) in enumerate(((10, "OK"), (30, "OK"), (5, "ERROR"), (100, "OK"))):
        produce(tel_topic, key=p, value=serde.encode("phase_telemetry", _telemetry(p, "p-w1", n, age, now, status)))
    assert producer.flush(30) == 0 and refused == []
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


@pytest.fixture()
def earlier_stack(bootstrap: str) -> Iterator[dict[str, str]]:
    """Pool H of an earlier stack: work topics and a decode group that committed, no heartbeat;
    pool T: work topics only."""
    h, t = f"zh{uuid.uuid4().hex[:8]}", f"zt{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    made = [f"{kind}.{pool}" for pool in (h, t) for kind in ("prefill", "decode")]
    for future in admin.create_topics([NewTopic(name, 1, 1) for name in made]).values():
        future.result(timeout=30)
    group = f"phaseroute.decode.{h}"
    committer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    committer.commit(offsets=[TopicPartition(f"decode.{h}", 0, 0)], asynchronous=False)
    committer.close()
    yield {"h": h, "t": t}
    for future in admin.delete_topics(made).values():
        future.result(timeout=30)
    admin.delete_consumer_groups([group])[group].result(timeout=30)


def test_pools_of_earlier_stacks_show_only_with_all(bootstrap: str, fleet: dict[str, Any], earlier_stack: dict[str, str]) -> None:
    src = Sources(bootstrap, fleet["hb"], fleet["tel"])
    names = [fleet["p"], fleet["q"], earlier_stack["h"], earlier_stack["t"]]
    now_only = collect(src, time.time(), 60.0, names)
    assert {(r["pool"], r["phase"], r["state"]) for r in now_only} == {
        (fleet["p"], "prefill", "alive"), (fleet["q"], "decode", "dead")}
    with_history = collect(src, time.time(), 60.0, names, history=True)
    assert {(r["pool"], r["phase"], r["state"]) for r in with_history} == {
        (fleet["p"], "prefill", "alive"), (fleet["q"], "decode", "dead"),
        (earlier_stack["h"], "decode", "history"),  # the phase its group ran, no placeholder prefill row
        (earlier_stack["t"], None, "history")}  # topics alone do not say which phases it ran


def test_a_pool_up_started_shows_its_own_phase_before_its_first_heartbeat(bootstrap: str, fleet: dict[str, Any]) -> None:
    from phaseroute.infra.pool_spec import PoolSpec

    src = Sources(bootstrap, fleet["hb"], fleet["tel"])
    new = f"zn{uuid.uuid4().hex[:8]}"
    recorded = [PoolSpec(new, "both", "fp32"), PoolSpec(fleet["p"], "prefill", "fp32")]
    starting = collect(src, time.time(), 60.0, [new, fleet["p"]], recorded=recorded, running={f"worker-{new}-0": 1})
    assert [(r["pool"], r["phase"], r["state"], r["workers_alive"]) for r in starting] == [
        (new, "both", "starting", 0), (fleet["p"], "prefill", "alive", 1)]  # heartbeats win over the record
    gone = collect(src, time.time(), 60.0, [new], recorded=recorded, running={})
    assert [(r["pool"], r["state"]) for r in gone] == [(new, "dead")]


def test_pools_table_says_when_no_pool_runs(bootstrap: str, fleet: dict[str, Any], tmp_path: Any) -> None:
    app = typer.Typer()
    app.command("pools")(pools)
    app.command("other")(lambda: None)
    args = ["pools", "--pool", "zz-no-such-pool", "--heartbeat-topic", fleet["hb"], "--telemetry-topic", fleet["tel"]]
    result = CliRunner().invoke(app, args, env={"PHASEROUTE_BOOTSTRAP_SERVERS": bootstrap, "PHASEROUTE_HOME": str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert "no pool runs now (`--all` also shows the pools of earlier stacks)" in result.output
