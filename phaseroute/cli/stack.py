"""``phaseroute up``, ``down``, ``restart`` and ``topics``: the local stack and the topic spec."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from phaseroute.cli.common import current_settings, errors_as_messages, json_stdout, print_table, progress_printer
from phaseroute.config import Settings
from phaseroute.infra import cold_start, kafka_launcher, processes, provision, stack, topics
from phaseroute.infra.pool_spec import POOL_SPEC_EXAMPLE, POOL_SPEC_FORM

POOLS_HELP = (f"Also start the stack: pools as {escape(POOL_SPEC_FORM)},... (PHASE: prefill, decode or both; "
              f"THREADS per worker, default 1; WORKERS per pool, default 1), e.g. {POOL_SPEC_EXAMPLE}; or a YAML file.")


def up(
    pools: str = typer.Option(None, "--pools", help=POOLS_HELP),
    tenants: Path = typer.Option(None, "--tenants", help="Tenant weights and quotas (YAML) for the control plane."),
    profile: bool = typer.Option(True, "--profile/--no-profile",
        help="Give each new pool a cold-start profile (profile --quick) before it takes work."),
    wait: bool = typer.Option(True, "--wait/--no-wait",
        help="Return only once every pool has a live worker and a profile (the first job is admitted)."),
    wait_s: float = typer.Option(600.0, "--wait-s", min=1.0, help="Longest wait for the pools to be ready."),
    control: int = typer.Option(1, "--control", min=1, max=8,
        help="Control-plane instances: one is active (it holds the control lease), the others are standbys "
             "that take over when it dies."),
) -> None:
    """Start Kafka (unless --bootstrap-servers names a cluster), provision topics; with --pools also the
    telemetry service, result sink, control plane, drift monitor and each pool's workers."""
    cfg = current_settings()
    say = progress_printer()
    with errors_as_messages(kafka_launcher.ToolchainError, kafka_launcher.BrokerStartError, topics.TopicMismatchError,
                            cold_start.ColdStartError, ValueError, RuntimeError, TimeoutError):
        specs = stack.parse_pools(pools) if pools else []  # a bad spec fails before anything starts
        if cfg.external_kafka:
            say(f"using the Kafka cluster at {cfg.bootstrap_servers}")
        else:
            kafka_launcher.start(cfg, progress=say)
        wanted = topics.all_topics([p.name for p in specs])
        created = provision.provision(cfg.bootstrap_servers, wanted)
        say(f"topics: {len(created)} created, {len(wanted)} checked against the spec")
        if not specs:
            say("ready (`phaseroute up --pools ...` starts the stack; `phaseroute down` stops everything)")
            return
        if profile:
            cold_start.profile_new_pools(cfg, specs, say)
        names = stack.start(cfg, specs, tenants, progress=say, control_instances=control)
        if wait:
            stack.wait_until_ready(cfg, specs, names, wait_s, progress=say)
            say(f"ready: {len(specs)} pool(s) alive and profiled; logs in {cfg.run_dir / 'logs'}; "
                "`phaseroute pools` shows them, `phaseroute down` stops everything")
        else:
            say(f"started; logs in {cfg.run_dir / 'logs'}; `phaseroute down` stops everything")


def down(
    timeout_s: float = typer.Option(processes.DEFAULT_GRACE_S, "--timeout-s", min=0.0,
                                    help="How long each process may drain and close after SIGTERM before it is killed."),
) -> None:
    """Stop every recorded process (what `up` started and long-running commands started by hand):
    all together first, the broker last."""
    cfg = current_settings()
    say = progress_printer()
    alive = processes.running(cfg.run_dir)
    others = sorted(n for n in processes.names(cfg.run_dir) if n != "kafka")
    stopped: list[processes.Stopped] = []

    def heard(result: processes.Stopped) -> None:
        say(f"  {result.name} (pid {result.pid}): {result.ended.value} after {result.seconds:.1f} s")

    if alive.keys() - {"kafka"}:
        names = ", ".join(n for n in others if n in alive)
        say(f"stopping {len(alive.keys() - {'kafka'})} process(es) with SIGTERM (each may drain and close for up to "
            f"{timeout_s:.0f} s): {names}")
    stopped += processes.stop_many(cfg.run_dir, others, timeout_s, heard)
    if "kafka" in alive:
        say(f"stopping Kafka (pid {alive['kafka']}) ...")
    stopped += processes.stop_many(cfg.run_dir, ["kafka"], timeout_s, heard)
    stack.forget_pools(cfg.run_dir)
    ran = [s for s in stopped if s.ended is not processes.Ended.NOT_RUNNING]
    killed = [s.name for s in ran if s.ended is processes.Ended.KILLED]
    if not ran:
        say("nothing was running")
    else:
        say(f"stopped {len(ran)} process(es)" + (f"; killed after {timeout_s:.0f} s: {', '.join(killed)}" if killed else ""))


def restart(
    names: list[str] = typer.Argument(..., help="kafka, or processes `up` started: telemetry, results, control, drift, worker-POOL-N."),
    timeout_s: float = typer.Option(processes.DEFAULT_GRACE_S, "--timeout-s", min=0.0,
                                    help="How long the process may drain and close after SIGTERM before it is killed."),
) -> None:
    """Stop and start again only the named processes, e.g. `phaseroute restart kafka` (the broker, on
    the same data; clients reconnect). `phaseroute down` lists the names that are recorded."""
    cfg = current_settings()
    say = progress_printer()
    with errors_as_messages(kafka_launcher.ToolchainError, kafka_launcher.BrokerStartError, ValueError):
        for name in names:
            if name == "kafka":
                _restart_kafka(cfg, timeout_s, say)
            else:
                _restart_recorded(cfg, name, timeout_s, say)


def _restart_kafka(cfg: Settings, timeout_s: float, say: Callable[[str], None]) -> None:
    if cfg.external_kafka:
        raise ValueError(f"the Kafka cluster at {cfg.bootstrap_servers} is not one phaseroute started; restart it where it runs")
    pid = processes.alive_pid(cfg.run_dir, "kafka")
    if pid is not None:
        say(f"stopping Kafka (pid {pid}) ...")
        [result] = processes.stop_many(cfg.run_dir, ["kafka"], timeout_s)
        say(f"Kafka {result.ended.value} after {result.seconds:.1f} s")
    kafka_launcher.start(cfg, progress=say)


def _restart_recorded(cfg: Settings, name: str, timeout_s: float, say: Callable[[str], None]) -> None:
    record = processes.read_record(cfg.run_dir, name)
    if record is None:
        known = ", ".join(processes.names(cfg.run_dir)) or "none"
        raise ValueError(f"no process named {name!r} is recorded in {cfg.run_dir} (recorded: {known})")
    if record.by_hand:
        raise ValueError(f"{name!r} was started by hand ({' '.join(record.cmd)}); stop it with `phaseroute down` "
                         "or SIGTERM and start it again the same way")
    pid = processes.alive_pid(cfg.run_dir, name)
    if pid is not None:
        [result] = processes.stop_many(cfg.run_dir, [name], timeout_s)
        say(f"{name} (pid {pid}) {result.ended.value} after {result.seconds:.1f} s")
    log = Path(record.log) if record.log else cfg.run_dir / "logs" / f"{name}.log"
    new_pid = processes.spawn(cfg.run_dir, name, record.cmd, log, env={**os.environ, **record.env})
    say(f"started {name} again (pid {new_pid}; log {log})")


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
        with json_stdout(indent=2) as emit:
            emit(rows)
    else:
        table = Table("topic", "partitions", "replication", "cleanup.policy", "retention.ms", "value (Avro)", "key", "status")
        columns = ("topic", "partitions", "replication", "cleanup.policy", "retention.ms", "value", "key", "status")
        for r in rows:
            table.add_row(*(str(r[k]) for k in columns))
        print_table(table)
    if any(r["status"] != "ok" for r in rows):
        raise typer.Exit(1)
