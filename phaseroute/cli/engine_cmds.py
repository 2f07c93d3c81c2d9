"""Engine commands: ``phaseroute profile --pool NAME`` and ``phaseroute bench engine --json``.

Register in ``phaseroute/cli/main.py``::

    from phaseroute.cli import engine_cmds
    app.command("profile")(engine_cmds.profile)
    app.add_typer(engine_cmds.bench_app, name="bench")

Heavy imports (torch, transformers) happen inside the commands, so ``phaseroute --help`` stays fast.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

from phaseroute.cli.common import console, current_settings, errors_as_messages, json_stdout

bench_app = typer.Typer(no_args_is_help=True, add_completion=False, help="Benchmarks of phaseroute components.")


def profile(
    pool: str = typer.Option(..., "--pool", help="Pool name the rows are recorded under."),
    variant: str = typer.Option(None, "--variant",
        help="fp32 | bf16 | int8-dynamic | int8-weight (default: the pool name if it is a variant, else fp32)."),
    model: str = typer.Option("smollm2-135m", "--model", help="Model name."),
    threads: int = typer.Option(2, "--threads", min=1, help="torch intra-op threads."),
    device: str = typer.Option("cpu", "--device", help="cpu | cuda | cuda:N."),
    backend: str = typer.Option("torch", "--backend", help="Executor backend (torch | vllm)."),
    quick: bool = typer.Option(False, "--quick", help="Small grid (well under a minute on 2 cores)."),
    write: bool = typer.Option(True, "--write/--no-write", help="Insert the rows into ClickHouse (engine_profile)."),
    jsonl: Path = typer.Option(None, "--jsonl",
        help="Also write the rows to this JSON-lines file."),
    if_missing: bool = typer.Option(False, "--if-missing",
        help="Measure only if ClickHouse holds no profile of this pool, variant, model and thread count."),
) -> None:
    """Microbenchmark prefill (batch x prompt length) and decode (batch x context) for one pool."""
    from phaseroute.engine.errors import EngineError
    from phaseroute.engine.profiler import FULL, QUICK, profile_executor
    from phaseroute.engine.registry import build_executor
    from phaseroute.engine.variants import VARIANTS
    from phaseroute.infra.clickhouse import ClickHouseLockedError

    chosen = variant or (pool if pool in VARIANTS else "fp32")
    started = time.perf_counter()
    client = None
    if write or if_missing:  # before a minute of measuring: can the rows be written at all?
        with errors_as_messages(ClickHouseLockedError):
            client = _profile_table()
        if if_missing:
            have = _existing_run(client, pool, chosen, model, threads)
            if have is not None:
                console.print(f"pool {pool!r} (variant {chosen!r}, {threads} threads) already has a cold-start profile "
                              f"(run {have[0]} at {have[1]} UTC); nothing measured", highlight=False)
                return
    with errors_as_messages(EngineError, ValueError):
        ex = build_executor(model, chosen, threads=threads, device=device, backend=backend)
        rows = profile_executor(ex, pool, QUICK if quick else FULL, backend=backend)
    for row in rows:
        console.print(
            f"{row['phase']:>7} batch={row['batch_size']:<3} seq={row['seq_len']:<5} "
            f"{row['tokens_per_s']:9.1f} tok/s  {1e3 * row['latency_s']:9.1f} ms  "
            f"mem/token={row['memory_bytes_per_token']:.0f} B",
            highlight=False,
        )
    if jsonl:
        with open(jsonl, "w") as f:
            for row in rows:
                f.write(json.dumps({**row, "at": row["at"].isoformat()}) + "\n")
    written = 0
    if write:
        from phaseroute.engine.profiler import COLUMNS, TABLE
        from phaseroute.infra.clickhouse import insert_rows

        written = insert_rows(client, f"{current_settings().clickhouse_database}.{TABLE}", rows, COLUMNS)
    console.print(f"profile of pool {pool!r} (variant {chosen!r}): {len(rows)} rows measured, {written} written "
                  f"in {time.perf_counter() - started:.1f} s", highlight=False)


def _profile_table() -> Any:
    """A ClickHouse client with ``engine_profile`` created; one line saying what to do when the
    telemetry service holds the embedded chdb (it owns it while the stack is up)."""
    from phaseroute.engine.profiler import profile_ddl
    from phaseroute.infra.clickhouse import ClickHouseLockedError, chdb_owner, connect

    cfg = current_settings()
    if not cfg.clickhouse_url:
        owner = chdb_owner(cfg.chdb_path)
        if owner is not None:
            raise ClickHouseLockedError(
                f"the telemetry service (process {owner}) holds the embedded ClickHouse at {cfg.chdb_path} while "
                "the stack is up, and chdb allows one process: `phaseroute up --pools ...` profiles each new pool "
                "itself; or run `phaseroute profile` with the stack down (`phaseroute down`), or with "
                "--no-write --jsonl FILE to keep the rows in a file")
    client = connect(cfg)
    for statement in profile_ddl(cfg.clickhouse_database):
        client.command(statement)
    return client


def _existing_run(client: Any, pool: str, variant: str, model: str, threads: int) -> tuple[str, str] | None:
    """(run id, time) of the newest profile run of this pool, variant, model and thread count."""
    from phaseroute.engine.profiler import TABLE

    database = current_settings().clickhouse_database
    answer = client.query(
        f"SELECT run_id, toString(max(at)) FROM {database}.{TABLE} "
        "WHERE pool = {pool:String} AND variant = {variant:String} AND model = {model:String} "
        "AND threads = {threads:UInt16} GROUP BY run_id ORDER BY max(at) DESC LIMIT 1",
        parameters={"pool": pool, "variant": variant, "model": model, "threads": threads},
    )
    rows = answer.result_rows
    return (str(rows[0][0]), str(rows[0][1])) if rows else None


@bench_app.command("engine")
def bench_engine(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    variant: str = typer.Option("fp32", "--variant", help="Pool variant to benchmark."),
    model: str = typer.Option("smollm2-135m", "--model", help="Model name."),
    threads: int = typer.Option(2, "--threads", min=1, help="torch intra-op threads."),
    prompts: int = typer.Option(64, "--prompts", min=8, help="Number of prompts (mixed lengths)."),
    store: str = typer.Option(None, "--store", help="KV store URL or directory (default: settings kv_store)."),
    passes: int = typer.Option(3, "--passes", min=1, help="Rounds of (continuous, generate()) decode; figures are medians."),
) -> None:
    """Continuous batching vs generate() per request, prefill tokens/s, KV handoff cost, memory."""
    from phaseroute.engine.bench import BenchConfig, run_bench
    from phaseroute.engine.errors import EngineError

    with errors_as_messages(EngineError, ValueError), json_stdout(as_json) as emit:
        config = BenchConfig(model=model, variant=variant, threads=threads, n_prompts=prompts, store_url=store,
                             passes=passes)
        started = time.perf_counter()
        report = run_bench(config, progress=lambda msg: console.print(f"[{time.perf_counter() - started:6.1f} s] {msg}", highlight=False))
        if as_json:
            emit(report)
            return
    for key, value in report.items():
        console.print(f"{key:>42}: {value}", highlight=False)
