"""Fixtures for the profile builder tests: one embedded chdb per test session (chdb allows one
engine per process) with a fresh database per test, telemetry rows with readable defaults, and
a reader for the records a test topic holds.

Helpers come as fixtures because test modules are imported with ``--import-mode=importlib``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from phaseroute.config import load_settings
from phaseroute.consumers.telemetry_sink import TELEMETRY_COLUMNS
from phaseroute.infra.clickhouse import apply_ddl, connect, insert_rows
from phaseroute.schemas import serde

NOW = 1_800_000_000.0  # 2027-01-15; every test passes time in


@pytest.fixture(scope="session")
def chdb(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return connect(load_settings(home=tmp_path_factory.mktemp("chdb-home")))


@pytest.fixture()
def db(chdb: Any) -> str:
    name = f"t_{uuid.uuid4().hex[:10]}"
    chdb.command(f"CREATE DATABASE {name}")
    apply_ddl(chdb, name)
    return name


def telemetry(batch_id: str, pool: str, phase: str, age_s: float, **fields: Any) -> dict[str, Any]:
    """One ``phase_telemetry`` row finished ``age_s`` before NOW."""
    row = {
        "batch_id": batch_id, "pool": pool, "worker_id": f"{pool}.w1", "model": "m", "phase": phase, "variant": "fp32",
        "batch_size": 1, "tokens_in": 0, "tokens_out": 0, "seq_len_mean": 100.0, "seq_len_max": 100,
        "queue_wait_s": 0.0, "exec_time_s": 1.0, "steps": 1, "step_latency_s": 1.0, "step_latency_s_max": 1.0,
        "kv_bytes": 0, "kv_transfer_s": 0.0, "source_pool": None, "status": "OK", "error_class": None,
        "at": dt.datetime.fromtimestamp(NOW - age_s, dt.UTC),
    }
    unknown = set(fields) - set(row)
    assert not unknown, f"not telemetry columns: {unknown}"
    row.update(fields)
    return row


def insert(client: Any, database: str, rows: list[dict[str, Any]]) -> int:
    return insert_rows(client, f"{database}.phase_telemetry", rows, TELEMETRY_COLUMNS)


def read_topic(bootstrap: str, topic: str, kind: str) -> list[tuple[str, dict[str, Any]]]:
    """(key, record) of every message on partition 0 of ``topic``, oldest first."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, 0, 0)])
    out = []
    try:
        while True:
            msg = consumer.poll(10)
            assert msg is not None, f"no end of {topic} within 10 s"
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
                return out
            out.append((msg.key().decode(), serde.decode(msg.value(), kind)[1]))
    finally:
        consumer.close()


@pytest.fixture()
def tel() -> SimpleNamespace:
    return SimpleNamespace(NOW=NOW, row=telemetry, insert=insert, read_topic=read_topic)


@pytest.fixture()
def ts() -> Callable[[float], dt.datetime]:
    return lambda age_s: dt.datetime.fromtimestamp(NOW - age_s, dt.UTC)
