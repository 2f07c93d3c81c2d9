"""Cold-start profile of one pool: microbenchmarks of prefill and decode, written to ClickHouse.

The router needs a cost model before live telemetry exists. For one executor (model + variant
+ threads + device) this measures:

* prefill over a grid of batch size x prompt length: seconds per batch, tokens/s, RSS growth per
  token while the KV is held;
* decode over a grid of batch size x context length: seconds per step (every row generating,
  EOS ignored so the batch stays full), tokens/s, KV bytes allocated per live token.

Each grid cell becomes one row of ``{db}.engine_profile`` (DDL in ``infra/sql/profiler.sql``),
inserted as one Arrow batch. ``QUICK`` runs in well under a minute on 2 cores.
"""

from __future__ import annotations

import platform
import resource
import statistics
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import psutil

from phaseroute.engine.protocol import DecodeRequest, PrefillItem, PrefillResult
from phaseroute.schemas.enums import Phase

TABLE = "engine_profile"
COLUMNS = [
    "run_id", "pool", "model", "variant", "backend", "device", "dtype", "quantization", "threads", "host",
    "phase", "batch_size", "seq_len", "samples", "latency_s", "latency_p50_s", "tokens_per_s",
    "kv_bytes_per_token", "memory_bytes_per_token", "peak_rss_bytes", "at",
]


@dataclass(frozen=True)
class ProfileGrid:
    prefill_batches: tuple[int, ...]
    prefill_lengths: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_steps: int
    repeats: int


QUICK = ProfileGrid((1, 4), (32, 128), (1, 8), (64, 256), decode_steps=4, repeats=1)
FULL = ProfileGrid((1, 2, 4, 8), (32, 128, 512, 1024), (1, 4, 16, 32, 64), (128, 512, 1024), decode_steps=8, repeats=2)


def profile_executor(ex: Any, pool: str, grid: ProfileGrid, backend: str = "torch") -> list[dict[str, Any]]:
    """Run the grid on ``ex``; one row per cell (cells beyond the context or KV budget are skipped)."""
    base = {
        "run_id": uuid.uuid4().hex, "pool": pool, "model": ex.model_name, "variant": ex.variant,
        "backend": backend, "device": ex.config.device, "dtype": ex.config.dtype,
        "quantization": ex.config.quantization or "none", "threads": ex.config.threads,
        "host": platform.node(), "kv_bytes_per_token": ex.kv_bytes_per_token(),
    }
    ex.prefill([PrefillItem("warmup", 1, token_ids=tuple(_tokens(ex, 16)))])
    rows = []
    for batch in grid.prefill_batches:
        for length in grid.prefill_lengths:
            if _fits(ex, batch, length + 1):
                rows.append({**base, **_prefill_cell(ex, batch, length, grid.repeats)})
    for context in grid.decode_contexts:
        if not _fits(ex, 1, context + grid.decode_steps + 3):
            continue
        [prompt] = ex.prefill([PrefillItem("ctx", 2, token_ids=tuple(_tokens(ex, context)))])
        for batch in grid.decode_batches:
            if _fits(ex, batch, context + grid.decode_steps + 3):
                rows.append({**base, **_decode_cell(ex, prompt, batch, grid.decode_steps)})
    return rows


def _prefill_cell(ex: Any, batch: int, length: int, repeats: int) -> dict[str, Any]:
    items = [PrefillItem(f"p{i}", 1, token_ids=tuple(_tokens(ex, length, offset=i))) for i in range(batch)]
    latencies, deltas = [], []
    for _ in range(max(1, repeats)):
        rss = psutil.Process().memory_info().rss
        t0 = time.perf_counter()
        results = ex.prefill(items)
        latencies.append(time.perf_counter() - t0)
        deltas.append(max(0, psutil.Process().memory_info().rss - rss))
        del results
    latency = statistics.mean(latencies)
    return _cell(Phase.PREFILL.value, batch, length, latencies, batch * length / latency, statistics.median(deltas) / (batch * length))


def _decode_cell(ex: Any, prompt: PrefillResult, batch: int, steps: int) -> dict[str, Any]:
    session = ex.decode_session(max_batch=batch, ignore_eos=True)
    for i in range(batch):
        session.add(DecodeRequest(f"d{i}", prompt.kv, prompt.first_token, steps + 3))  # nobody leaves
    session.step()  # warm-up
    latencies = []
    for _ in range(steps):
        t0 = time.perf_counter()
        session.step()
        latencies.append(time.perf_counter() - t0)
    live = session.kv.live_tokens()
    per_token = session.kv_bytes_allocated() / max(1, live)
    return _cell(Phase.DECODE.value, batch, prompt.prompt_len, latencies, batch / statistics.mean(latencies), per_token)


def _cell(phase: str, batch: int, seq_len: int, latencies: list[float], tokens_per_s: float, mem_per_token: float) -> dict[str, Any]:
    return {
        "phase": phase, "batch_size": batch, "seq_len": seq_len, "samples": len(latencies),
        "latency_s": statistics.mean(latencies), "latency_p50_s": statistics.median(latencies),
        "tokens_per_s": tokens_per_s, "memory_bytes_per_token": float(mem_per_token),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "at": datetime.now(UTC),
    }


class _Budgeted(Protocol):
    """What ``_fits`` reads of an executor (``TorchExecutor`` has these)."""

    @property
    def max_context(self) -> int: ...
    @property
    def kv_budget_bytes(self) -> int: ...
    def kv_bytes_per_token(self) -> int: ...


def _fits(ex: _Budgeted, batch: int, tokens: int) -> bool:
    return tokens <= ex.max_context and batch * tokens * ex.kv_bytes_per_token() <= ex.kv_budget_bytes


def _tokens(ex: Any, n: int, offset: int = 0) -> list[int]:
    """``n`` real-text token ids (the prompts passage, cycled); synthetic ids for tokenizer-less models."""
    if ex.tokenizer is None:
        vocab = int(ex.model.config.vocab_size)
        return [(7 * (i + offset) + 3) % vocab for i in range(n)]
    from phaseroute.engine.prompts import passage_ids

    corpus = passage_ids(ex.tokenizer)
    return [corpus[(i + 13 * offset) % len(corpus)] for i in range(n)]


def write_rows(rows: list[dict[str, Any]], settings: Any = None) -> int:
    """Create ``engine_profile`` if needed and insert ``rows`` as one Arrow batch; returns the row count."""
    from phaseroute.config import settings as default_settings
    from phaseroute.infra.clickhouse import connect, insert_rows

    settings = settings or default_settings()
    client = connect(settings)
    for statement in profile_ddl(settings.clickhouse_database):
        client.command(statement)
    return insert_rows(client, f"{settings.clickhouse_database}.{TABLE}", rows, COLUMNS)


def profile_ddl(database: str) -> list[str]:
    """The statements of ``infra/sql/profiler.sql`` (only this table: no dependency on other DDL files)."""
    from importlib import resources

    text = (resources.files("phaseroute.infra") / "sql" / "profiler.sql").read_text()
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip().replace("{db}", database) for s in text.split(";") if s.strip()]
