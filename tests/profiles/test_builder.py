"""The profile builder on embedded chdb and the real broker: telemetry and a cold-start profile
in, ``profile_row`` records out on a test topic, decoded back into a ProfileTable."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from phaseroute.consumers.kafka_clients import TrackedProducer
from phaseroute.engine.profiler import COLUMNS as PROFILE_COLUMNS
from phaseroute.infra.clickhouse import insert_rows
from phaseroute.streams.policy import LinkProfile, Phase, ProfileSource
from phaseroute.streams.profiles import BuilderConfig, ProfileBuilder, from_avro, record_key, table_from_avro

pytestmark = pytest.mark.kafka

STEP_S = {"fast": 0.05, "slow": 0.2}  # the slow pool's steps take 4x longer


def _fleet(tel: SimpleNamespace) -> list[dict[str, Any]]:
    rows = []
    for pool, step in STEP_S.items():
        for i in range(20):  # decode windows of 10 steps at batch 8, one every 10 s
            rows.append(tel.row(f"{pool}/d{i}", pool, "DECODE", 10 * i, batch_size=8, tokens_out=80, steps=10,
                                exec_time_s=10 * step, step_latency_s=step, step_latency_s_max=1.2 * step))
        for i in range(5):  # prefill micro-batches of 4 x 128 tokens, one every 30 s
            rows.append(tel.row(f"{pool}/p{i}", pool, "PREFILL", 30 * i, batch_size=4, tokens_in=512, tokens_out=4,
                                exec_time_s=20 * step, step_latency_s=20 * step, step_latency_s_max=20 * step))
    rows.append(tel.row("slow/e0", "slow", "DECODE", 5, batch_size=8, status="ERROR", error_class="OutOfMemoryError",
                        exec_time_s=0.0))
    for k in range(1, 7):  # KV of fast's prefills moved to slow: 46,080 bytes per token, 100 MB/s + 5 ms
        rows.append(tel.row(f"slow/t{k}", "slow", "TRANSFER", k, source_pool="fast", tokens_in=100 * k,
                            kv_bytes=4_608_000 * k, kv_transfer_s=0.005 + 0.04608 * k, exec_time_s=0.005 + 0.04608 * k))
    return rows


def _profile_run(ts: Callable[[float], Any]) -> list[dict[str, Any]]:
    base = {"run_id": "run-1", "pool": "fast", "model": "m", "variant": "fp32", "backend": "torch", "device": "cpu",
            "dtype": "float32", "quantization": "none", "threads": 2, "host": "h", "kv_bytes_per_token": 46_080,
            "peak_rss_bytes": 10**9, "at": ts(7200), "seq_len": 128, "samples": 4, "memory_bytes_per_token": 55_000.0}
    return [
        {**base, "phase": "DECODE", "batch_size": 8, "latency_s": 0.06, "latency_p50_s": 0.06, "tokens_per_s": 8 / 0.06},
        {**base, "phase": "PREFILL", "batch_size": 4, "latency_s": 1.2, "latency_p50_s": 1.2, "tokens_per_s": 512 / 1.2},
    ]


def test_builder_publishes_rows_that_rank_pools_by_measured_speed(
    chdb: Any, db: str, tel: SimpleNamespace, ts: Any, bootstrap: str, make_topic: Callable[..., str]
) -> None:
    tel.insert(chdb, db, _fleet(tel))
    insert_rows(chdb, f"{db}.engine_profile", _profile_run(ts), PROFILE_COLUMNS)
    topic = make_topic("profiles")
    builder = ProfileBuilder(chdb, TrackedProducer(bootstrap, "test-profile-builder"), db, BuilderConfig(topic=topic))

    published = builder.build_once(tel.NOW)
    on_topic = tel.read_topic(bootstrap, topic, "profile_row")
    assert [k for k, _ in on_topic] == [record_key(r) for r in published]
    assert sorted(k for k, _ in on_topic) == [
        "*|TRANSFER|slow|*|fast",
        "m|DECODE|fast|fp32|profiler", "m|DECODE|fast|fp32|telemetry", "m|DECODE|slow|fp32|telemetry",
        "m|PREFILL|fast|fp32|profiler", "m|PREFILL|fast|fp32|telemetry", "m|PREFILL|slow|fp32|telemetry",
    ]
    table = table_from_avro(r for _, r in on_topic)
    decoded = {(r.phase, r.pool, r.source): r for r in (from_avro(rec) for _, rec in on_topic) if not isinstance(r, LinkProfile)}
    tele = {(ph, pool): decoded[(ph, pool, ProfileSource.TELEMETRY)] for ph in Phase for pool in STEP_S}

    fast, slow = tele[(Phase.DECODE, "fast")], tele[(Phase.DECODE, "slow")]
    assert fast.tokens_per_s(8) == pytest.approx(8 / 0.05) and slow.tokens_per_s(8) == pytest.approx(8 / 0.2)
    assert fast.tokens_per_s(8) / slow.tokens_per_s(8) == pytest.approx(4.0)
    assert tele[(Phase.PREFILL, "fast")].tokens_per_s(4) / tele[(Phase.PREFILL, "slow")].tokens_per_s(4) == pytest.approx(4.0)
    assert (fast.samples, slow.samples, fast.error_rate, slow.error_rate) == (20, 21, 0.0, pytest.approx(1 / 21))
    assert fast.updated_at == pytest.approx(tel.NOW) and fast.step_p50_s == pytest.approx(0.05, rel=1e-6)
    # KV per token measured from the transfers of fast's KV; memory from fast's cold-start profile
    assert tele[(Phase.PREFILL, "fast")].kv_bytes_per_token == pytest.approx(46_080.0)
    assert fast.mem_bytes_per_token == pytest.approx(55_000.0)
    prof = decoded[(Phase.DECODE, "fast", ProfileSource.PROFILER)]
    assert prof.tokens_per_s(8) == pytest.approx(8 / 0.06) and prof.updated_at == pytest.approx(tel.NOW - 7200)
    link = table.link("fast", "slow")
    assert link is not None and link.samples == 6
    assert link.bytes_per_s == pytest.approx(1e8, rel=1e-6) and link.latency_s == pytest.approx(0.005, rel=1e-6)

    # nothing new: nothing published, however the decay weights moved
    assert builder.build_once(tel.NOW + 5) == []
    # the slow pool got faster: only its decode row changes
    newer = [tel.row(f"slow/n{i}", "slow", "DECODE", -5, batch_size=8, tokens_out=80, steps=10, exec_time_s=0.5,
                     step_latency_s=0.05, step_latency_s_max=0.06) for i in range(20)]
    tel.insert(chdb, db, newer)
    again = builder.build_once(tel.NOW + 5)
    assert [record_key(r) for r in again] == ["m|DECODE|slow|fp32|telemetry"]
    assert from_avro(again[0]).tokens_per_s(8) > slow.tokens_per_s(8) * 2
    assert len(tel.read_topic(bootstrap, topic, "profile_row")) == len(on_topic) + 1


def test_on_tick_builds_once_per_interval(chdb: Any, db: str, tel: SimpleNamespace, bootstrap: str,
                                          make_topic: Callable[..., str]) -> None:
    builder = ProfileBuilder(chdb, TrackedProducer(bootstrap, "test-profile-builder"), db,
                             BuilderConfig(topic=make_topic("profiles"), interval_s=3600))
    builder.on_tick(None)
    builder.on_tick(None)
    assert builder.stats == {"builds": 1, "published": 0, "failures": 0}


def test_a_failed_build_is_counted_and_the_service_goes_on(chdb: Any, tel: SimpleNamespace, bootstrap: str) -> None:
    builder = ProfileBuilder(chdb, TrackedProducer(bootstrap, "test-profile-builder"), "no_such_database")
    builder.on_tick(None)
    assert builder.stats["failures"] == 1 and builder.stats["builds"] == 0


SERVICE = """
import json, sys
from phaseroute.config import load_settings
from phaseroute.consumers.worker import build_telemetry_sink
loop = build_telemetry_sink(load_settings(home=sys.argv[1], telemetry_port=int(sys.argv[2])), group_suffix=".test-unused")
builder = loop.profile_builder
loop._on_tick(loop)  # what every turn of the sink loop does (nothing to publish in an empty chdb)
loop._on_tick(loop)
print(json.dumps({"tick_is_builder": loop._on_tick == builder.on_tick, "topic": builder.config.topic, **builder.stats}))
loop.consumer.close()
"""


def test_the_telemetry_service_runs_the_builder_on_its_ticks(tmp_path: Any, bootstrap: str) -> None:
    import json
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a free port for the service's SQL server (never started here)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the service imports torch and the profile builder: minutes on a loaded 2-core machine
    proc = subprocess.run([sys.executable, "-c", SERVICE, str(tmp_path), str(port)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"tick_is_builder": True, "topic": "profiles", "builds": 1, "published": 0, "failures": 0}
