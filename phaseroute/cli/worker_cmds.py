"""``phaseroute worker`` and ``phaseroute sink``: the data-plane processes (each runs until SIGTERM
and records itself in the run dir, so ``phaseroute down`` stops it also when started by hand)."""

from __future__ import annotations

import logging

import typer

from phaseroute.cli.common import console, current_settings, errors_as_messages, long_running
from phaseroute.consumers.prefill_budget import PREFILL_CHUNK_TOKENS
from phaseroute.consumers.worker_defaults import (
    MAX_DECODE_BATCH,
    PREFILL_MAX_BATCH,
    PREFILL_MAX_BATCH_TOKENS,
    PREFILL_MAX_WAIT_S,
)


@long_running(lambda kw: f"worker-{kw['pool']}-{kw['phase']}")
def worker(
    pool: str = typer.Option(..., "--pool", help="Pool this worker serves (its topics are prefill.POOL / decode.POOL)."),
    phase: str = typer.Option(..., "--phase", help="prefill, decode, or both (colocated)."),
    variant: str = typer.Option("fp32", "--variant", help="Engine variant: fp32, bf16, int8-dynamic, int8-weight."),
    model: str = typer.Option("smollm2-135m", "--model"),
    threads: int = typer.Option(None, "--threads", help="torch threads (default: every core this process may use)."),
    device: str = typer.Option(None, "--device", help="cpu or cuda (default: the variant's)."),
    max_batch: int = typer.Option(PREFILL_MAX_BATCH, "--max-batch", help="Prefill micro-batch: most requests per batch."),
    max_batch_tokens: int = typer.Option(PREFILL_MAX_BATCH_TOKENS, "--max-batch-tokens", help="Prefill micro-batch: most prompt tokens."),
    max_wait_ms: float = typer.Option(PREFILL_MAX_WAIT_S * 1000, "--max-wait-ms",
        help="Prefill micro-batch: longest wait of the first item."),
    max_decode_batch: int = typer.Option(MAX_DECODE_BATCH, "--max-decode-batch", help="Most sequences in the continuous decode batch."),
    prefill_chunk_tokens: int = typer.Option(PREFILL_CHUNK_TOKENS, "--prefill-chunk-tokens",
        help="Colocated: padded prompt tokens per prefill chunk between decode steps."),
    nice: int = typer.Option(0, "--nice", min=0, max=19,
        help="CPU priority, 0 (normal) to 19 (lowest): `up` runs decode-only pools beside prefilling ones at 10."),
    worker_id: str = typer.Option(None, "--worker-id"),
    throttle_file: str = typer.Option(None, "--throttle-file",
        help="Fault injection: slow this worker by the factor in FILE (re-read every second)."),
    inject_kv_bitflips: float = typer.Option(0.0, "--inject-kv-bitflips",
        help="Fault injection: flip this share of the bits of every KV blob this prefill worker hands over, CRC recomputed (drift tests)."),
    inject_kv_bitflips_to: str = typer.Option(None, "--inject-kv-bitflips-to",
        help="Fault injection: corrupt only blobs for this decode pool (one path)."),
) -> None:
    """Run one prefill, decode or colocated worker until SIGTERM."""
    from phaseroute.consumers.machine import lower_priority
    from phaseroute.consumers.worker import WorkerOptions, build_phase_worker, run
    from phaseroute.engine.errors import EngineError

    if nice:
        lower_priority(nice)  # before the model and Kafka clients start their threads
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = current_settings()
    with errors_as_messages(ValueError, EngineError):
        opts = WorkerOptions(
            pool=pool, phase=phase, variant=variant, model=model, threads=threads, device=device, max_batch=max_batch,
            max_batch_tokens=max_batch_tokens, max_wait_s=max_wait_ms / 1000, max_decode_batch=max_decode_batch,
            prefill_chunk_tokens=prefill_chunk_tokens, worker_id=worker_id, throttle_file=throttle_file,
            kv_bitflips=inject_kv_bitflips, kv_bitflips_to=inject_kv_bitflips_to,
        )
        loop, heartbeat = build_phase_worker(settings, opts)
    console.print(f"worker {loop.config.client_id} on {sorted(loop.config.topic_kinds)} (group {loop.config.group_id})")
    run(loop, heartbeat)


@long_running(lambda kw: f"sink-{kw['kind']}")
def sink(
    kind: str = typer.Argument(..., help="results or telemetry"),
    group_suffix: str = typer.Option("", "--group-suffix", hidden=True, help="Tests: a consumer group of their own."),
) -> None:
    """Run the result sink (per-job output files) or the telemetry sink (ClickHouse) until SIGTERM."""
    from phaseroute.consumers.worker import build_result_sink, build_telemetry_sink, run
    from phaseroute.infra.clickhouse import ClickHouseLockedError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = current_settings()
    builders = {"results": build_result_sink, "telemetry": build_telemetry_sink}
    if kind not in builders:
        console.print(f"[red]error:[/] sink {kind!r} must be one of {sorted(builders)}")
        raise typer.Exit(2)
    with errors_as_messages(ClickHouseLockedError):
        loop = builders[kind](settings, group_suffix)
    run(loop, None)
