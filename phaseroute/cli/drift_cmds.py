"""``phaseroute drift ...``: the drift monitor, the canary reference, offline measurement, and
the drift report (plus ``drift_summary`` / ``plot_drift`` for the demo summary and ``phaseroute
report``).

Register in ``phaseroute/cli/main.py``::

    from phaseroute.cli import drift_cmds
    app.add_typer(drift_cmds.drift_app, name="drift")

``python -m phaseroute.cli.drift_cmds monitor`` runs the same app without that registration (the
stack starts the monitor that way). Heavy imports happen inside the commands.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

import typer

from phaseroute.cli.common import console, current_settings, errors_as_messages, json_stdout, long_running

drift_app = typer.Typer(no_args_is_help=True, add_completion=False,
                        help="Quality drift: canaries through every path, measured against a reference.")
VARIANTS = ("fp32", "bf16", "int8-weight", "int8-dynamic")


@drift_app.command("monitor")
@long_running(lambda _kw: "drift")
def monitor(
    interval_s: float = typer.Option(60.0, "--interval-s", help="Seconds between two canary rounds on one path."),
    round_timeout_s: float = typer.Option(180.0, "--round-timeout-s",
                                          help="A round closes with what came back after this long, if that can decide..."),
    round_give_up_s: float = typer.Option(960.0, "--round-give-up-s",
                                          help="...else it waits for late canaries up to this long."),
    canaries: int = typer.Option(8, "--canaries", min=1, help="Canaries per path and round (each runs greedy and forced)."),
    pool: list[str] = typer.Option([], "--pool", help="Measure only paths between these pools (repeat; default: all live pools)."),
    demote_after: int = typer.Option(1, "--demote-after", min=1, help="Failing rounds in a row that demote a path from EXACT work."),
    recover_after: int = typer.Option(3, "--recover-after", min=1, help="Passing rounds in a row that restore a demoted path."),
) -> None:
    """Run the drift monitor until SIGTERM: canaries per pool and path, drift to ClickHouse, quality to the router."""
    from phaseroute.consumers.drift_monitor import MonitorConfig
    from phaseroute.consumers.drift_monitor_service import MonitorService
    from phaseroute.streams.policy.quality import QualityConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = current_settings()
    with errors_as_messages(ValueError):
        config = MonitorConfig(interval_s=interval_s, round_timeout_s=round_timeout_s, round_give_up_s=round_give_up_s,
                               canaries=canaries,
                               quality=QualityConfig(demote_after=demote_after, recover_after=recover_after),
                               only_pools=tuple(pool))
    service = MonitorService(settings.bootstrap_servers, config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    service.start()
    console.print(f"drift monitor: a round every {interval_s:.0f} s per path, {canaries} canaries")
    try:
        while not stop.is_set():
            service.run_once(poll_s=0.5)
    finally:
        service.close()


@drift_app.command("reference")
def reference(
    model: str = typer.Option("smollm2-135m", "--model"),
    version: str = typer.Option("v1", "--version", help="Canary set version (change it whenever prompts or reference change)."),
    max_tokens: int = typer.Option(16, "--max-tokens", min=1),
    top_k: int = typer.Option(32, "--top-k", min=1, help="Reference log-probs kept per position (the KL's support)."),
    out: Path = typer.Option(None, "--out", help="Write here instead of the package's canary file."),
) -> None:
    """Compute the canary reference on the reference configuration (fp32, colocated) and store it."""
    from phaseroute.engine.canaries import write_canaries
    from phaseroute.engine.canaries.build import build_reference
    from phaseroute.engine.registry import build_executor

    executor = build_executor(model, "fp32", threads=2)
    path = write_canaries(build_reference(executor, model, version, max_tokens, top_k), out)
    console.print(f"canary reference of {model} ({version}) written to {path}")


@drift_app.command("measure")
def measure(
    model: str = typer.Option("smollm2-135m", "--model"),
    variant: list[str] = typer.Option(list(VARIANTS), "--variant", help="Variants to measure (repeat)."),
    threads: int = typer.Option(2, "--threads", min=1),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document ({model, threads, variants: [...]}) instead of a table."),
) -> None:
    """Drift of each variant against the reference, in this process (prefill and decode on the variant)."""
    from dataclasses import asdict

    from rich.table import Table

    from phaseroute.engine.canaries import load_canaries
    from phaseroute.engine.canaries.build import run_in_process
    from phaseroute.engine.registry import build_executor

    canary_set = load_canaries(model)
    table = Table("variant", "greedy agreement", "top-1 agreement", "mean KL (nats)", "max KL (nats)", "first divergence")
    measured = []
    with json_stdout(as_json) as emit:
        for name in variant:
            started = time.perf_counter()
            m = run_in_process(build_executor(model, name, threads=threads), canary_set)
            measured.append({"variant": name, **asdict(m), "seconds": round(time.perf_counter() - started, 1)})
            table.add_row(name, f"{m.greedy_agreement:.3f}", f"{m.top1_agreement:.3f}", f"{m.mean_kl:.3g}", f"{m.max_kl:.3g}",
                          f"{m.first_divergence_mean:.2f} (min {m.first_divergence_min})")
        if as_json:
            emit({"model": model, "threads": threads, "variants": measured})
            return
    console.print(table)


def _rows(port: int, sql: str) -> list[dict[str, Any]]:
    from phaseroute.consumers.query_server import remote_query

    answer = remote_query(port, sql)
    return [dict(zip(answer["columns"], row)) for row in answer["rows"]]


def drift_summary(port: int, since_s: float | None = None, database: str = "phaseroute") -> dict[str, Any]:
    """Drift figures from ClickHouse (through the telemetry service on ``port``) since ``since_s``
    (epoch seconds; None: everything): per numerics combination, the latest state of each path,
    the alerts, and the per-path timeline."""
    where = "" if since_s is None else f"WHERE at >= toDateTime64({float(since_s)}, 3)"
    table = f"{database}.drift_measurement FINAL"
    path = "if(colocated, prefill_pool, concat(prefill_pool, '->', decode_pool))"
    return {
        "by_variant": _rows(port, f"""
            SELECT prefill_variant, decode_variant, colocated, count() AS rounds,
                   sum(greedy_agreement * positions) / sum(positions) AS greedy_agreement,
                   sum(top1_agreement * positions) / sum(positions) AS top1_agreement,
                   avg(mean_kl) AS mean_kl_avg, max(max_kl) AS max_kl_max, avg(first_divergence_mean) AS first_divergence
            FROM {table} {where} GROUP BY prefill_variant, decode_variant, colocated ORDER BY mean_kl_avg"""),
        "paths": _rows(port, f"""
            SELECT {path} AS path, argMax(state, at) AS state_now, argMax(exact_ok, at) AS exact_ok_now,
                   argMax(top1_agreement, at) AS top1_now, argMax(mean_kl, at) AS mean_kl_now, count() AS rounds
            FROM {table} {where} GROUP BY path ORDER BY path"""),
        "alerts": _rows(port, f"""
            SELECT toString(at) AS at_utc, {path} AS path, kind, reason
            FROM {database}.quality_alert FINAL {where} ORDER BY at"""),
        "timeline": _rows(port, f"""
            SELECT {path} AS path, toUnixTimestamp64Milli(at) / 1000 AS at_s, top1_agreement, greedy_agreement,
                   mean_kl, exact_ok FROM {table} {where} ORDER BY at"""),
    }


def plot_drift(timeline: list[dict[str, Any]], out: Path) -> Path:
    """Top-1 agreement and mean KL over time per path (demoted rounds marked with x) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, kl) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    start = min((r["at_s"] for r in timeline), default=0.0)
    for path in sorted({r["path"] for r in timeline}):
        rows = [r for r in timeline if r["path"] == path]
        t = [(r["at_s"] - start) / 60 for r in rows]
        line = top.plot(t, [r["top1_agreement"] for r in rows], marker="o", label=path)[0]
        kl.plot(t, [max(r["mean_kl"], 1e-12) for r in rows], marker="o", color=line.get_color())
        bad = [(x, r) for x, r in zip(t, rows) if not r["exact_ok"]]
        top.scatter([x for x, _ in bad], [r["top1_agreement"] for _, r in bad], marker="x", s=80, color="black", zorder=3)
    top.set_ylabel("teacher-forced top-1 agreement")
    kl.set_ylabel("mean KL vs reference (nats)")
    kl.set_yscale("log")
    kl.set_xlabel("minutes (x: demoted from EXACT work)")
    top.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


@drift_app.command("report")
def report(
    since_min: float = typer.Option(None, "--since-min", help="Only the last N minutes (default: everything)."),
    plot: Path = typer.Option(None, "--plot", help="Also draw drift over time per path into this PNG."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Drift per variant and path, alerts, and (with --plot) drift over time, from ClickHouse."""
    from rich.table import Table

    from phaseroute.consumers.query_server import QueryError

    settings = current_settings()
    with errors_as_messages(QueryError, OSError), json_stdout(as_json) as emit:
        summary = drift_summary(settings.telemetry_port, None if since_min is None else time.time() - 60 * since_min,
                                settings.clickhouse_database)
        if plot is not None:
            plot_drift(summary["timeline"], plot)
        if as_json:
            emit({k: v for k, v in summary.items() if k != "timeline"})
            return
    for name in ("by_variant", "paths", "alerts"):
        rows = summary[name]
        table = Table(*(rows[0].keys() if rows else ["(none)"]), title=name)
        for row in rows:
            table.add_row(*(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row.values()))
        console.print(table)
    if plot is not None:
        console.print(f"plot written to {plot}")


if __name__ == "__main__":  # pragma: no cover
    drift_app()
