"""``phaseroute bench sink``: what the telemetry sink costs per record, on a real broker and chdb.

A producer thread trickles ``--rate`` ``phase_telemetry`` records a second for ``--seconds``
to a fresh topic; this process runs the telemetry sink's loop (``WorkerLoop`` +
``TelemetrySinkHandler``, the service's own code) on it with a throw-away embedded ClickHouse,
and prints the loop thread's CPU (share of a core, ms per record), the inserts and their CPU.
``--poll-rule spin`` runs the poll rule from before issue 14 (never wait while records are
buffered), for comparison. Needs a running broker (``phaseroute up``); the topic is deleted after.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

import typer

from phaseroute.cli.common import console, current_settings


def bench_sink(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    rate: float = typer.Option(20.0, "--rate", min=1.0, help="Records per second the producer sends."),
    seconds: float = typer.Option(20.0, "--seconds", min=2.0, help="How long the producer sends."),
    poll_rule: str = typer.Option("wait", "--poll-rule", help="wait (the loop's rule) or spin (before issue 14)."),
) -> None:
    """CPU per telemetry record of the telemetry sink's loop and inserts."""
    if poll_rule not in ("wait", "spin"):
        console.print(f"[red]error:[/] --poll-rule {poll_rule!r} must be wait or spin")
        raise typer.Exit(2)
    report = run(current_settings().bootstrap_servers, rate, seconds, poll_rule)
    if as_json:
        sys.stdout.write(json.dumps(report) + "\n")
        return
    for key, value in report.items():
        console.print(f"{key:>28}: {value}", highlight=False)


def run(bootstrap: str, rate: float, seconds: float, poll_rule: str) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # re-exported, not listed

    from phaseroute.config import load_settings
    from phaseroute.consumers.loop import LoopConfig, WorkerLoop
    from phaseroute.consumers.telemetry_sink import TelemetrySinkHandler
    from phaseroute.infra.clickhouse import apply_ddl, connect

    class SpinningLoop(WorkerLoop):
        def _poll_wait_s(self, now: float) -> float:  # before issue 14: no wait while anything is buffered
            return 0.0 if self.handler.in_flight() else self.config.poll_timeout_s

    client = connect(load_settings(home=tempfile.mkdtemp(prefix="bench-sink-")))
    apply_ddl(client, "phaseroute")
    topic = f"bench.sink.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
    handler = TelemetrySinkHandler(client, "phaseroute")
    config = LoopConfig(bootstrap, f"bench-sink-{uuid.uuid4().hex[:6]}", "bench-sink", {topic: "phase_telemetry"},
                        "bench-sink", max_poll=1000, consumer_overrides={"auto.offset.reset": "earliest"})
    loop = (SpinningLoop if poll_rule == "spin" else WorkerLoop)(config, handler)
    try:
        loop.consumer.subscribe([topic], on_assign=loop._on_assign, on_revoke=loop._on_revoke)
        producer = threading.Thread(target=_trickle, args=(bootstrap, topic, rate, seconds), daemon=True)
        producer.start()
        t0, cpu0 = time.time(), time.thread_time()
        while producer.is_alive() or handler.in_flight():
            loop.run_once()
        wall, cpu = time.time() - t0, time.thread_time() - cpu0
    finally:
        loop.consumer.close()
        admin.delete_topics([topic])
    records = max(1, handler.cost.records)
    return {
        "poll_rule": poll_rule, "records": handler.cost.records, "inserts": handler.cost.batches, "wall_s": round(wall, 1),
        "loop_thread_cpu_s": round(cpu, 3), "loop_share_of_a_core": round(cpu / wall, 4),
        "loop_cpu_ms_per_record": round(1e3 * cpu / records, 3),
        "insert_cpu_ms_per_record": round(1e3 * handler.cost.cpu_s / records, 3),
        "insert_wall_ms_per_insert": round(1e3 * handler.cost.wall_s / max(1, handler.cost.batches), 2),
    }


def _trickle(bootstrap: str, topic: str, rate: float, seconds: float) -> None:
    """Send ``rate`` records a second (one thread of this process; its CPU is not the loop thread's)."""
    from confluent_kafka import Producer

    from phaseroute.consumers.telemetry_records import WorkerTag, telemetry_output
    from phaseroute.schemas import serde

    producer = Producer({"bootstrap.servers": bootstrap})
    tag = WorkerTag("bench", f"bench-sink-{uuid.uuid4().hex[:6]}", "smollm2-135m", "fp32")
    end, n = time.time() + seconds, 0
    while time.time() < end:
        record = telemetry_output(tag, f"{tag.worker_id}/{n}", "DECODE", batch_size=8, tokens_out=128).record
        producer.produce(topic, key=tag.pool, value=serde.encode("phase_telemetry", record))
        producer.poll(0)
        n += 1
        time.sleep(1.0 / rate)
    producer.flush(10)
