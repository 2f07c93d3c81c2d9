"""``phaseroute api`` (the Batch API server) and ``phaseroute tenants ...`` (the tenant
registry: tenants, weights, quotas and API keys; operator commands that write the compacted
``tenants`` topic directly)."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path

import typer

from phaseroute.cli.common import console, current_settings, errors_as_messages

tenants_app = typer.Typer(no_args_is_help=True, help="Tenants, weights, quotas and API keys (the tenant registry).")


def api(host: str = typer.Option(None, "--host", help="Listen address (env PHASEROUTE_API_HOST, default 127.0.0.1)."),
        port: int = typer.Option(None, "--port", help="Port (env PHASEROUTE_API_PORT, default 8000).")) -> None:
    """Serve the OpenAI-compatible Batch API (Files + Batches) until SIGTERM."""
    from phaseroute.api.server import serve

    serve(current_settings(), host, port)


def _errors() -> AbstractContextManager[None]:
    from phaseroute.api.kafka_io import BrokerUnavailable

    return errors_as_messages(ValueError, BrokerUnavailable, RuntimeError)


def _quotas(max_in_flight: int | None, max_queued_tokens: int | None, max_running_jobs: int | None) -> dict[str, int | None]:
    return {"max_in_flight": max_in_flight, "max_queued_tokens": max_queued_tokens, "max_running_jobs": max_running_jobs}


@tenants_app.command("add")
def add(name: str = typer.Argument(...), weight: float = typer.Option(1.0, "--weight", help="Fair-share weight (> 0)."),
        max_in_flight: int = typer.Option(None, "--max-in-flight", help="Most requests dispatched at once."),
        max_queued_tokens: int = typer.Option(None, "--max-queued-tokens", help="Most admitted, unfinished tokens."),
        max_running_jobs: int = typer.Option(None, "--max-running-jobs", help="Most unfinished jobs.")) -> None:
    """Register a tenant and print its first API key (shown once; only its hash is stored)."""
    from phaseroute.api import registry

    with _errors():
        record, key = registry.add_tenant(current_settings().bootstrap_servers, name, weight,
                                          _quotas(max_in_flight, max_queued_tokens, max_running_jobs))
    console.print(f"tenant {name} (weight {record['weight']:g}); API key id {record['keys'][0]['key_id']}, "
                  "shown once — keep it:", highlight=False)
    print(key)


@tenants_app.command("key")
def new_key(name: str = typer.Argument(...)) -> None:
    """Make another API key for a tenant (for rotation) and print it once."""
    from phaseroute.api import registry

    bootstrap = current_settings().bootstrap_servers
    with _errors():
        record, key = registry.with_new_key(registry.existing(bootstrap, name))
        registry.save(bootstrap, record)
    console.print(f"new key id {record['keys'][-1]['key_id']} for {name}, shown once:", highlight=False)
    print(key)


@tenants_app.command("revoke")
def revoke(name: str = typer.Argument(...), key_id: str = typer.Option(None, "--key-id", help="One key (default: all)."),
           disable: bool = typer.Option(False, "--disable", help="Also switch the tenant off (no new jobs).")) -> None:
    """Revoke a tenant's key (or every key); the API refuses it within a second."""
    from phaseroute.api import registry

    bootstrap = current_settings().bootstrap_servers
    with _errors():
        record = registry.with_revoked(registry.existing(bootstrap, name), key_id)
        registry.save(bootstrap, dict(record, disabled=record.get("disabled") or disable))
    console.print(f"revoked {'key ' + key_id if key_id else 'every key'} of {name}", highlight=False)


@tenants_app.command("set")
def update(name: str = typer.Argument(...), weight: float = typer.Option(None, "--weight"),
           max_in_flight: int = typer.Option(None, "--max-in-flight"),
           max_queued_tokens: int = typer.Option(None, "--max-queued-tokens"),
           max_running_jobs: int = typer.Option(None, "--max-running-jobs"),
           enable: bool = typer.Option(None, "--enable/--disable")) -> None:
    """Change a tenant's weight, quotas or enabled flag (keys stay)."""
    import time

    from phaseroute.api import registry

    bootstrap = current_settings().bootstrap_servers
    with _errors():
        record = dict(registry.existing(bootstrap, name))
        if weight is not None:
            if not weight > 0:
                raise ValueError(f"--weight {weight} must be > 0")
            record["weight"] = weight
        for field, value in _quotas(max_in_flight, max_queued_tokens, max_running_jobs).items():
            if value is not None:
                record[field] = value
        if enable is not None:
            record["disabled"] = not enable
        record["updated_at"] = int(time.time() * 1000)
        registry.save(bootstrap, record)
    console.print(f"tenant {name} updated", highlight=False)


@tenants_app.command("list")
def list_tenants(as_json: bool = typer.Option(False, "--json")) -> None:
    """Tenants with weight, quotas and key ids (never the keys or their hashes)."""
    from phaseroute.api import registry

    with _errors():
        tenants = registry.read_tenants(current_settings().bootstrap_servers)
    rows = [{"name": n, "weight": r["weight"], "max_in_flight": r.get("max_in_flight"),
             "max_queued_tokens": r.get("max_queued_tokens"), "max_running_jobs": r.get("max_running_jobs"),
             "disabled": r.get("disabled", False),
             "keys": [{"key_id": k["key_id"], "revoked": k.get("revoked_at") is not None} for k in r.get("keys") or []]}
            for n, r in sorted(tenants.items())]
    if as_json:
        print(json.dumps(rows))
        return
    for row in rows:
        keys = ", ".join(k["key_id"] + (" (revoked)" if k["revoked"] else "") for k in row["keys"]) or "no keys"
        console.print(f"{row['name']}: weight {row['weight']:g}, in flight {row['max_in_flight'] or '-'}, "
                      f"queued tokens {row['max_queued_tokens'] or '-'}, jobs {row['max_running_jobs'] or '-'}"
                      f"{', DISABLED' if row['disabled'] else ''}; keys: {keys}", highlight=False)


@tenants_app.command("import")
def import_file(file: Path = typer.Argument(..., exists=True, dir_okay=False, help="YAML {tenant: {weight, ...}}.")) -> None:
    """Write a tenants YAML file (the former `control --tenants` file) into the registry; keys stay."""
    import yaml

    from phaseroute.api import registry

    with _errors():
        names = registry.import_yaml(current_settings().bootstrap_servers, yaml.safe_load(file.read_text()))
    console.print(f"imported {len(names)} tenant(s): {', '.join(names)} (add keys with `phaseroute tenants key NAME`)",
                  highlight=False)


def bench_admission(lines: int = typer.Option(50_000, "--lines", help="Requests in the big batch."),
                    profile: bool = typer.Option(True, "--profile/--no-profile", help="Profile the pool first."),
                    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
                    intake_only: bool = typer.Option(False, "--intake-only", help="Only scan_job_input, in this "
                                                     "process (no stack): the intake's own time and memory.")) -> None:
    """Admission of a 50,000-line batch through the API: time, peak RSS per process, and another
    tenant's small batch meanwhile. Starts and stops its own API, control plane, sinks and worker."""
    from phaseroute.api.admission_bench import run_bench, run_intake_only

    with _errors(), errors_as_messages(TimeoutError):
        figures = run_intake_only(current_settings(), lines) if intake_only else run_bench(current_settings(), lines, profile)
    if as_json:
        print(json.dumps(figures))
        return
    for name, value in figures.items():
        console.print(f"{name}: {value}", highlight=False)
