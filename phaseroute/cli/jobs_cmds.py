"""Producer commands ``submit``, ``status``, ``results``, ``cancel``, plus ``control`` and ``demo``.

With an API key (``--api-key`` or ``PHASEROUTE_API_KEY``) the job commands go through the
Batch API at ``PHASEROUTE_API_URL`` (default http://127.0.0.1:<api_port>/v1), exactly as an
``openai`` SDK user would: the key decides the tenant, and another tenant's batch is "not
found". Without a key they are operator commands that read and write Kafka and the blob
store directly (``--tenant`` names the owner; an unknown job or another tenant's job is "not
found" too). A cluster that does not answer is one line, not a traceback.
"""

from __future__ import annotations

import json
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from phaseroute.cli.common import console, current_settings, errors_as_messages, fail
from phaseroute.cli.jobs_operator import (  # noqa: F401  (the demo imports them from here)
    job_of_tenant,
    job_record,
    latest_job_states,
    new_job_id,
    output_lines,
    parse_deadline,
    publish,
)

if TYPE_CHECKING:
    from phaseroute.api.client import BatchClient

KEY_HELP = "A tenant's API key: go through the Batch API (env PHASEROUTE_API_KEY). Without one: operator mode."
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "EXPIRED", "REJECTED"}
FINAL_STATUSES = {"completed", "failed", "expired", "cancelled"}


def _errors() -> AbstractContextManager[None]:
    from phaseroute.api.client import ApiClientError
    from phaseroute.api.kafka_io import BrokerUnavailable

    return errors_as_messages(ValueError, RuntimeError, BrokerUnavailable, ApiClientError, OSError)


def _client(key: str | None) -> BatchClient | None:
    from phaseroute.api.client import BatchClient

    settings = current_settings()
    key = key or settings.api_key
    return BatchClient(settings.api_base_url, key) if key else None


def _need_tenant(client: Any, tenant: str | None) -> None:
    if client is None and not tenant:
        fail("give --api-key (or PHASEROUTE_API_KEY) to go through the Batch API, or --tenant for operator mode")


def _window(deadline: str) -> str:
    text = deadline.strip()
    if text[-1:] in "smhd" and text[:-1].replace(".", "", 1).isdigit():
        return text
    seconds = parse_deadline(text, time.time()) - time.time()
    return f"{max(1, int(seconds))}s"


def submit(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, help="OpenAI Batch input JSONL."),
    api_key: str = typer.Option(None, "--api-key", help=KEY_HELP),
    tenant: str = typer.Option(None, "--tenant", help="Operator mode: the tenant that owns the job."),
    priority: int = typer.Option(1, "--priority"),
    deadline: str = typer.Option("2h", "--deadline", help="Duration from now (90s, 30m, 2h) or ISO-8601 time."),
    job_id: str = typer.Option(None, "--job-id", help="Operator mode: client-chosen id (resubmitting never runs it twice)."),
    idempotency_key: str = typer.Option(None, "--idempotency-key", help="API mode: the same key never creates two batches."),
    quality: str = typer.Option("exact", "--quality", help="exact or approximate."),
    tolerance: float = typer.Option(None, "--tolerance", help="Approximate tier: accepted quality loss (0..1)."),
    model: str = typer.Option("smollm2-135m", "--model", help="Operator mode: the model (API mode: body.model)."),
    max_tokens: int = typer.Option(64, "--max-tokens", help="Operator mode: max_tokens for lines that set none."),
    wait: bool = typer.Option(False, "--wait", help="Show progress until the job finishes."),
) -> None:
    """Submit a batch: through the API with a key, or (operator) straight to jobs.submitted."""
    if quality not in ("exact", "approximate"):
        fail(f"--quality {quality!r} must be exact or approximate")
    client = _client(api_key)
    _need_tenant(client, tenant)
    with _errors():
        if client is not None:
            metadata = {"priority": str(priority), "quality_tier": quality}
            if tolerance is not None:
                metadata["quality_tolerance"] = str(tolerance)
            uploaded = client.upload(file)
            batch = client.create(uploaded["id"], "/v1/chat/completions", _window(deadline), metadata, idempotency_key)
            job = batch["id"]
        else:
            settings = current_settings()
            record = job_record(file, tenant, priority, parse_deadline(deadline, time.time()), job_id or new_job_id(),
                                quality, model, max_tokens, tolerance, settings.blob_store)
            publish(settings.bootstrap_servers, "jobs.submitted", record["job_id"], "job_submitted", record)
            job = record["job_id"]
    print(job)
    if wait:
        follow(job, api_key)
    else:
        console.print(f"submitted; follow it with `phaseroute status {job}` or `phaseroute submit ... --wait`",
                      highlight=False)


def _snapshot(job_id: str, api_key: str | None, tenant: str | None = None) -> dict[str, Any]:
    """(API) the batch object, or (operator) the job's latest event, as one dict."""
    client = _client(api_key)
    if client is not None:
        batch = client.batch(job_id)
        counts = batch["request_counts"]
        return {"mode": "api", "state": batch["status"], "final": batch["status"] in FINAL_STATUSES,
                "total": counts["total"], "finished": counts["completed"] + counts["failed"], "record": batch}
    event = job_of_tenant(current_settings().bootstrap_servers, job_id, tenant)
    return {"mode": "operator", "state": event["state"], "final": event["state"] in FINAL_STATES,
            "total": event["requests_total"], "finished": event["requests_done"] + event["requests_failed"],
            "record": event}


def follow(job_id: str, api_key: str | None = None, timeout_s: float = 3600) -> dict[str, Any]:
    """Progress bar until the job reaches a final state; returns its last snapshot."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from phaseroute.api.client import ApiClientError
    from phaseroute.api.kafka_io import BrokerUnavailable

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                             console=console) as bar:
        task = bar.add_task(job_id, total=None)
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            try:
                snap = _snapshot(job_id, api_key)
            except ValueError:  # not in jobs.state yet
                time.sleep(1.0)
                continue
            except (BrokerUnavailable, ApiClientError) as exc:
                fail(str(exc))
            bar.update(task, total=snap["total"] or None, completed=snap["finished"], description=f"{job_id} {snap['state']}")
            if snap["final"]:
                return snap
            time.sleep(1.0)
    fail(f"job {job_id} did not finish within {timeout_s:.0f} s")
    raise AssertionError


def status(job_id: str = typer.Argument(...), as_json: bool = typer.Option(False, "--json"),
           api_key: str = typer.Option(None, "--api-key", help=KEY_HELP),
           tenant: str = typer.Option(None, "--tenant", help="Operator mode: only this tenant's job.")) -> None:
    """The job's state: the batch object (API), or the latest jobs.state event (operator)."""
    with _errors():
        snap = _snapshot(job_id, api_key, tenant)
    record = snap["record"]
    if as_json:
        print(json.dumps(record))
        return
    if snap["mode"] == "api":
        errors = "; ".join(e.get("message") or "" for e in (record.get("errors") or {}).get("data", [])[:3])
        console.print(f"{job_id}: {record['status']} {record['request_counts']['completed']}/{snap['total']} done, "
                      f"{record['request_counts']['failed']} failed{' — ' + errors if errors else ''}", highlight=False)
        return
    reason = f" — {record['reason']}" if record.get("reason") else ""
    console.print(f"{job_id}: {record['state']} {record['requests_done']}/{record['requests_total']} done, "
                  f"{record['requests_failed']} failed, {record['tokens_out']} tokens out{reason}", highlight=False)


def results(job_id: str = typer.Argument(...), output: Path = typer.Option(None, "-o", "--output"),
            api_key: str = typer.Option(None, "--api-key", help=KEY_HELP),
            tenant: str = typer.Option(None, "--tenant", help="Operator mode: the tenant that owns the job.")) -> None:
    """The job's output lines (OpenAI Batch shape; failed requests included), printed or to -o."""
    client = _client(api_key)
    _need_tenant(client, tenant)
    with _errors():
        if client is not None:
            batch = client.batch(job_id)
            if batch["status"] not in FINAL_STATUSES:
                raise ValueError(f"batch {job_id} is {batch['status']}; its files exist once it is final")
            lines = [client.content(fid).decode() for fid in (batch["output_file_id"], batch["error_file_id"]) if fid]
            text = "".join(lines)
        else:
            job_of_tenant(current_settings().bootstrap_servers, job_id, tenant)
            text = "".join(line + "\n" for line in output_lines(current_settings().blob_store, tenant, job_id))
    if output:
        output.write_text(text)
        console.print(f"{text.count(chr(10))} lines -> {output}")
    else:
        print(text, end="")


def cancel(job_id: str = typer.Argument(...), api_key: str = typer.Option(None, "--api-key", help=KEY_HELP),
           tenant: str = typer.Option(None, "--tenant", help="Operator mode: the tenant that owns the job."),
           reason: str = typer.Option(None, "--reason")) -> None:
    """Cancel a job: queued requests are dropped, finished lines stay."""
    client = _client(api_key)
    _need_tenant(client, tenant)
    with _errors():
        if client is not None:
            batch = client.cancel(job_id)
            console.print(f"{job_id}: {batch['status']}", highlight=False)
            return
        settings = current_settings()
        event = job_of_tenant(settings.bootstrap_servers, job_id, tenant)
        if event["state"] in FINAL_STATES:
            raise ValueError(f"job {job_id!r} is already {event['state']}; nothing to cancel")
        record = {"job_id": job_id, "tenant": tenant, "command": "CANCEL", "at": int(time.time() * 1000), "reason": reason}
        publish(settings.bootstrap_servers, "jobs.commands", job_id, "job_command", record)
    console.print(f"cancel sent for {job_id} (it was {event['state']})", highlight=False)


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
