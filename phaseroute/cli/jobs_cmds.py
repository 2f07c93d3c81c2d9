"""Producer and operator commands: ``control``, ``submit``, ``status``, ``results``, ``cancel``.

A producer that does not use this CLI publishes the same Avro record itself: a
``job_submitted`` (schemas/avro/job_submitted.avsc) in Avro single-object encoding on topic
``jobs.submitted`` with the job id as key (confluent-kafka: partitioner murmur2_random).
"""

from __future__ import annotations

import json
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import typer

from phaseroute.cli.common import console, current_settings, fail

INLINE_LIMIT_BYTES = 256 * 1024
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")


def parse_deadline(text: str, now: float) -> float:
    """'90s', '30m', '2h', '1d' from now, or an ISO-8601 time; epoch seconds."""
    match = _DURATION.match(text.strip())
    if match:
        return now + float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(f"deadline {text!r} is neither a duration (90s, 30m, 2h, 1d) nor an ISO-8601 time") from None


def job_record(file: Path, tenant: str, priority: int, deadline_s: float, job_id: str, quality: str, model: str,
               max_tokens: int, tolerance: float | None) -> dict[str, Any]:
    """A ``job_submitted`` record for an OpenAI Batch input file (inline when small)."""
    now_ms = int(time.time() * 1000)
    record: dict[str, Any] = {
        "job_id": job_id, "tenant": tenant, "priority": priority, "submitted_at": now_ms,
        "deadline": int(deadline_s * 1000), "model": model, "quality_tier": quality.upper(),
        "quality_tolerance": tolerance, "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": max_tokens},
        "requests": [], "input_file": None,
    }
    if file.stat().st_size > INLINE_LIMIT_BYTES:
        record["input_file"] = str(file.resolve())
        return record
    from phaseroute.streams.intake import read_input_file

    for item in read_input_file(str(file)):
        record["requests"].append({"custom_id": item["custom_id"], "prompt": item["prompt"],
                                   "messages": item["messages"], "max_tokens": item["max_tokens"]})
    return record


def publish(bootstrap: str, topic: str, key: str, kind: str, record: dict[str, Any]) -> None:
    from confluent_kafka import Producer

    from phaseroute.schemas import serde

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "partitioner": "murmur2_random", "message.max.bytes": 8 * 1024 * 1024})
    producer.produce(topic, key=key.encode(), value=serde.encode(kind, record))
    if producer.flush(30):
        raise RuntimeError(f"the cluster at {bootstrap} did not acknowledge the {kind} within 30 s")


def latest_job_states(bootstrap: str, idle_s: float = 1.0) -> dict[str, dict[str, Any]]:
    """The latest event per job from the compacted ``jobs.state`` topic."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from phaseroute.schemas import serde

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"status-{uuid.uuid4().hex}", "enable.auto.commit": False})
    meta = consumer.list_topics("jobs.state", timeout=10).topics["jobs.state"]
    parts = [TopicPartition("jobs.state", p, OFFSET_BEGINNING) for p in meta.partitions]
    ends = {p.partition: consumer.get_watermark_offsets(p, timeout=10)[1] for p in parts}
    consumer.assign(parts)
    states: dict[str, dict[str, Any]] = {}
    done = {p for p, end in ends.items() if end == 0}
    deadline = time.time() + 30
    while len(done) < len(ends) and time.time() < deadline:
        msg = consumer.poll(idle_s)
        if msg is None or msg.error():
            continue
        event = serde.decode(msg.value(), "job_event")[1]
        if event["job_id"] not in states or states[event["job_id"]]["at"] <= event["at"]:
            states[event["job_id"]] = event
        if msg.offset() + 1 >= ends[msg.partition()]:
            done.add(msg.partition())
    consumer.close()
    return states


def submit(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="OpenAI Batch input JSONL."),
    tenant: str = typer.Option(..., "--tenant"),
    priority: int = typer.Option(1, "--priority"),
    deadline: str = typer.Option("2h", "--deadline", help="Duration from now (90s, 30m, 2h) or ISO-8601 time."),
    job_id: str = typer.Option(None, "--job-id", help="Client-chosen id: resubmitting it never runs the job twice."),
    quality: str = typer.Option("exact", "--quality", help="exact or approximate."),
    tolerance: float = typer.Option(None, "--tolerance", help="Approximate tier: accepted quality loss (0..1)."),
    model: str = typer.Option("smollm2-135m", "--model"),
    max_tokens: int = typer.Option(64, "--max-tokens", help="Default max_tokens for lines that set none."),
    wait: bool = typer.Option(False, "--wait", help="Show progress until the job finishes."),
) -> None:
    """Publish a job to jobs.submitted (and follow it with --wait)."""
    settings = current_settings()
    if quality not in ("exact", "approximate"):
        fail(f"--quality {quality!r} must be exact or approximate")
    try:
        record = job_record(file, tenant, priority, parse_deadline(deadline, time.time()), job_id or f"job-{uuid.uuid4().hex[:12]}",
                            quality, model, max_tokens, tolerance)
        publish(settings.bootstrap_servers, "jobs.submitted", record["job_id"], "job_submitted", record)
    except (ValueError, RuntimeError) as exc:
        fail(str(exc))
    print(record["job_id"])
    if wait:
        follow(settings.bootstrap_servers, record["job_id"])


def follow(bootstrap: str, job_id: str, timeout_s: float = 3600) -> dict[str, Any]:
    """Progress bar until the job reaches a final state; returns its last event."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    final = {"COMPLETED", "FAILED", "CANCELLED", "EXPIRED", "REJECTED"}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task(job_id, total=None)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            event = latest_job_states(bootstrap).get(job_id)
            if event:
                bar.update(task, total=event["requests_total"] or None, completed=event["requests_done"] + event["requests_failed"],
                           description=f"{job_id} {event['state']}")
                if event["state"] in final:
                    return event
            time.sleep(1.0)
    fail(f"job {job_id} did not finish within {timeout_s:.0f} s")
    raise AssertionError


def status(job_id: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json")) -> None:
    """The job's latest state (from the compacted jobs.state topic)."""
    event = latest_job_states(current_settings().bootstrap_servers).get(job_id)
    if event is None:
        fail(f"no job {job_id!r} in jobs.state")
    if as_json:
        print(json.dumps(event))
        return
    reason = f" — {event['reason']}" if event.get("reason") else ""
    console.print(f"{job_id}: {event['state']} {event['requests_done']}/{event['requests_total']} done, "
                  f"{event['requests_failed']} failed, {event['tokens_out']} tokens out{reason}", highlight=False)


def results(job_id: str = typer.Argument(...), output: Path = typer.Option(None, "-o", "--output")) -> None:
    """The job's output file (OpenAI Batch output lines), printed or copied to -o."""
    path = current_settings().results_dir / f"{job_id}.jsonl"
    if not path.exists():
        fail(f"no results for {job_id!r} yet ({path} does not exist; is `phaseroute sink results` running?)")
    if output:
        shutil.copyfile(path, output)
        console.print(f"{sum(1 for _ in open(path))} lines -> {output}")
    else:
        print(path.read_text(), end="")


def cancel(job_id: str = typer.Argument(...), tenant: str = typer.Option(..., "--tenant"),
           reason: str = typer.Option(None, "--reason")) -> None:
    """Ask the control plane to cancel a job (queued requests are dropped)."""
    record = {"job_id": job_id, "tenant": tenant, "command": "CANCEL", "at": int(time.time() * 1000), "reason": reason}
    publish(current_settings().bootstrap_servers, "jobs.commands", job_id, "job_command", record)
    console.print(f"cancel sent for {job_id}")


def control(tenants: Path = typer.Option(None, "--tenants", help="YAML: {tenant: {weight, max_in_flight, max_queued_tokens, max_running_jobs}}.")) -> None:
    """Run the control plane (Faust: admission, fair scheduler, router, tracker) until SIGTERM."""
    import logging

    import faust

    from phaseroute.streams.app import build_app

    settings = current_settings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app, _handle = build_app(settings, tenants)
    faust.Worker(app, loglevel="info", redirect_stdouts=False).execute_from_commandline()


def demo(
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON (progress stays on stderr)."),
    scale: float = typer.Option(1.0, "--scale", help="Multiply the number of requests per job."),
    timeout_s: float = typer.Option(480.0, "--timeout", help="Give up on the jobs after this many seconds."),
    profile: bool = typer.Option(True, "--profile/--no-profile", help="Measure cold-start profiles first."),
) -> None:
    """Run the main job: Kafka, ClickHouse telemetry, control plane, three real pools, three tenants."""
    from phaseroute.demo.run import DemoError, run_demo
    from phaseroute.infra.kafka_launcher import BrokerStartError, ToolchainError

    try:
        run_demo(current_settings(), as_json, scale, timeout_s, profile)
    except (DemoError, ToolchainError, BrokerStartError, TimeoutError, RuntimeError) as exc:
        fail(str(exc))
