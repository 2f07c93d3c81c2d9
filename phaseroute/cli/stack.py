"""``phaseroute up``, ``down`` and ``topics``: the local stack and the topic spec."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from phaseroute.cli.common import console, current_settings, errors_as_messages
from phaseroute.infra import kafka_launcher, processes, provision, stack, topics


def up(
    pools: str = typer.Option(None, "--pools", help="Also start the stack: pools as name=phase:variant[:threads][xN],... or a YAML file."),
    tenants: Path = typer.Option(None, "--tenants", help="Tenant weights and quotas (YAML) for the control plane."),
) -> None:
    """Start Kafka (unless --bootstrap-servers names a cluster), provision topics; with --pools also the
    telemetry service, result sink, control plane and each pool's workers."""
    cfg = current_settings()
    with errors_as_messages(kafka_launcher.ToolchainError, kafka_launcher.BrokerStartError, topics.TopicMismatchError, ValueError):
        if cfg.external_kafka:
            console.print(f"using the Kafka cluster at {cfg.bootstrap_servers}")
        else:
            pid = kafka_launcher.start(cfg)
            console.print(f"Kafka {cfg.kafka_version} (KRaft, single node) answers on {cfg.bootstrap_servers} (pid {pid})")
        specs = stack.parse_pools(pools) if pools else []
        created = provision.provision(cfg.bootstrap_servers, topics.all_topics([p.name for p in specs]))
        console.print(f"topics: {len(created)} created, spec checked")
        if specs:
            names = stack.start(cfg, specs, tenants)
            console.print(f"started: {', '.join(names)} (logs in {cfg.run_dir / 'logs'}; `phaseroute down` stops them)")


def down() -> None:
    """Stop every process `phaseroute up` started (workers and agents first, the broker last)."""
    cfg = current_settings()
    stopped = processes.stop_all(cfg.run_dir, last=["kafka"])
    console.print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))


def list_topics(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    check: list[str] = typer.Option([], "--check", help="Only these topics (an unknown name is an error)."),
) -> None:
    """List the provisioned topics with partitions and configuration, checked against the spec."""
    cfg = current_settings()
    with errors_as_messages(topics.UnknownTopicError, ValueError):
        admin = provision.admin_client(cfg.bootstrap_servers)
        cluster_names = [n for n in admin.list_topics(timeout=10).topics if not n.startswith("__")]
        pools = sorted({n.split(".", 1)[1] for n in cluster_names if n.split(".", 1)[0] in topics.POOL_TOPIC_TEMPLATES})
        specs = [topics.spec_for(n, pools) for n in check] if check else topics.all_topics(pools)
        states = provision.describe(admin, [s.name for s in specs])
    rows = []
    for spec in specs:
        state = states.get(spec.name)
        problems = provision.mismatches(spec, state) if state else ["missing"]
        rows.append({
            "topic": spec.name, "partitions": state.partitions if state else None,
            "replication": state.replication if state else None,
            "cleanup.policy": state.config.get("cleanup.policy") if state else None,
            "retention.ms": state.config.get("retention.ms") if state else None,
            "value": spec.value_kind, "key": spec.key, "status": "ok" if not problems else "; ".join(problems),
        })
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        table = Table("topic", "partitions", "replication", "cleanup.policy", "retention.ms", "value (Avro)", "key", "status")
        for r in rows:
            table.add_row(*(str(r[k]) for k in ("topic", "partitions", "replication", "cleanup.policy", "retention.ms", "value", "key", "status")))
        console.print(table)
    if any(r["status"] != "ok" for r in rows):
        raise typer.Exit(1)
