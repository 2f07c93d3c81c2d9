"""The prefill micro-batch's token budget, from the pool's measured profile.

A pool's PREFILL PROFILER row (the cold-start profiler's grid, on the compacted ``profiles``
topic) carries a batch curve, prompt tokens/s by requests per batch, measured over prompts of
one length. The TELEMETRY row of the same pool is not used: live batches mix lengths, and the
short prompts (and the drift monitor's canaries) are the ones that fill large batches, so its
large-batch points are slow because their prompts are short, not because the batch is large;
sizing from it drifted a worker down to batches of one. The efficient batch is
the smallest batch size whose throughput reaches ``EFFICIENT_SHARE`` of the best measured one:
a bigger batch only adds waiting (the first item waits for the rest) and padding, for little
more throughput. On a CPU, where prefill is compute-bound, that is usually a batch of one.

Life of the budget in a worker: at start ``load_prefill_curve`` reads the pool's PREFILL
PROFILER row from ``profiles`` (bounded by a timeout; none found: the configured ``max_batch_tokens`` stays);
``TokenBudget.observe`` keeps the running mean of the prompts the worker accepted, and
``tokens()`` is efficient batch x mean prompt tokens, within ``[1 prompt, max_batch_tokens]``
(``budget_batch_size``: a curve still rising at its largest measured batch leaves the ceiling).
``PaddingRule`` bounds the padding a prompt may add to a batch by what it saves, from the
worker's own batch times. ``efficient_batch_size``, ``budget_batch_size``, ``TokenBudget`` and
``PaddingRule`` are pure; only the loader touches Kafka.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from phaseroute.schemas.enums import Phase, ProfileSource

log = logging.getLogger(__name__)
EFFICIENT_SHARE = 0.9  # of the best measured prefill tokens/s
PREFILL_CHUNK_TOKENS = 1024
"""A colocated worker with sequences decoding runs a prefill batch in chunks of about this many
padded tokens, one decode step after each: decode waits at most one chunk (about 1.7 s at this
CPU's ~600 prompt tokens/s), never a whole long batch. Smaller chunks cost throughput twice: a
chunk that continues a cache runs slower per token, and every chunk adds a decode step at a
small batch, which costs about as much as one at a large batch on a CPU. Measured here (48
mixed prompts, 7 near lengths a batch): prefill alone at 467 tok/s in 256-token chunks, 622 in
1024, 584-595 unchunked; ``phaseroute bench pipeline --setups colocated`` 0.55-0.57x the
engine at 256 (95-99 decode steps, mean batch 11-13) and 0.67x at 1024 (62 steps, batch 19)."""


def efficient_batch_size(curve: Sequence[tuple[int, float]], share: float = EFFICIENT_SHARE) -> int | None:
    """The smallest batch size reaching ``share`` of the curve's best tokens/s; None for an empty curve."""
    points = sorted((int(b), float(t)) for b, t in curve if b >= 1 and t > 0)
    if not points:
        return None
    best = max(t for _, t in points)
    return next(b for b, t in points if t >= share * best)


def budget_batch_size(curve: Sequence[tuple[int, float]], share: float = EFFICIENT_SHARE) -> int | None:
    """The efficient batch the worker's token budget uses: ``efficient_batch_size``, or None (the
    configured ceiling) when that is the largest batch the curve measured. The curve was still
    rising there, so nothing says a larger batch is not faster: the quick cold-start profile
    measures batches 1 and 4 only, and on this CPU a batch of 8 equal prompts is faster still."""
    efficient = efficient_batch_size(curve, share)
    if efficient is None or efficient >= max(int(b) for b, t in curve if b >= 1 and t > 0):
        return None
    return efficient


@dataclass
class TokenBudget:
    """Prompt tokens one micro-batch may hold: efficient batch x the mean prompt seen."""

    ceiling: int  # the configured max_batch_tokens
    efficient_batch: int | None = None  # from the profile; None: always the ceiling
    prompts_seen: int = 0
    mean_prompt_tokens: float = 0.0

    def observe(self, prompt_tokens: int) -> None:
        self.prompts_seen += 1
        self.mean_prompt_tokens += (prompt_tokens - self.mean_prompt_tokens) / self.prompts_seen

    def tokens(self) -> int:
        if self.efficient_batch is None or not self.prompts_seen:
            return self.ceiling
        return max(1, min(self.ceiling, round(self.efficient_batch * self.mean_prompt_tokens)))


@dataclass
class PaddingRule:
    """How many padded positions a prompt may add to a micro-batch, from the worker's own batches.

    A forward pass costs a fixed time (reading every weight once) plus time per position it
    computes: ``seconds = fixed_s + positions / positions_per_s``, fitted by least squares to the
    last ``window`` batches this worker ran (positions = prompts x the longest prompt). Joining a
    batch saves a prompt one fixed cost and costs the positions its padding adds, so it pays
    while those positions are at most ``fixed_s x positions_per_s`` (``break_even_positions``).
    On these CPUs that is a few dozen positions (a 48-token prompt joins 64-token ones, a 384-token
    one does not join 512-token ones), where a fixed 25% share let batches compute 17-21% padding
    (``bench pipeline``, 2026-12-07); on an accelerator, where the fixed cost is most of a pass, it
    is thousands. None until the batches seen span enough sizes to fit (``pick_batch`` then keeps
    its share bound alone).
    """

    window: int = 32
    batches: list[tuple[int, float]] = field(default_factory=list)  # (positions, seconds)

    def observe(self, positions: int, seconds: float) -> None:
        if positions >= 1 and seconds > 0:
            self.batches = [*self.batches, (positions, seconds)][-self.window:]

    def break_even_positions(self) -> float | None:
        n = len(self.batches)
        if n < 4:
            return None
        mean_p = sum(p for p, _ in self.batches) / n
        mean_s = sum(s for _, s in self.batches) / n
        spread = sum((p - mean_p) ** 2 for p, _ in self.batches)
        if spread < (0.25 * mean_p) ** 2 * n:  # batches of about one size: nothing to fit
            return None
        per_position = sum((p - mean_p) * (s - mean_s) for p, s in self.batches) / spread
        fixed_s = mean_s - per_position * mean_p
        if per_position <= 0 or fixed_s <= 0:
            return 0.0 if per_position > 0 else None  # no fixed cost to save: padding never pays
        return fixed_s / per_position


def load_prefill_curve(bootstrap: str, topic: str, model: str, pool: str, variant: str, timeout_s: float = 5.0,
                       source: ProfileSource = ProfileSource.PROFILER) -> list[tuple[int, float]]:
    """The batch curve of the newest PREFILL row of ``source`` for (model, pool, variant) on
    ``topic``; [] if none in time."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from phaseroute.infra.kafka_security import with_cluster_config
    from phaseroute.schemas import serde

    consumer = Consumer(with_cluster_config({
        "bootstrap.servers": bootstrap, "group.id": f"phaseroute.budget.{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False, "enable.partition.eof": True, "auto.offset.reset": "earliest"}))
    best: dict[str, Any] | None = None
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
        pending, deadline = set(meta.partitions), time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                    continue
                value = msg.value()
                try:
                    if value is None:
                        raise ValueError(f"profile row at {msg.topic()}[{msg.partition()}]@{msg.offset()} has no value")
                    _, row = serde.decode(value, "profile_row")
                except Exception as exc:
                    log.debug("skipping an undecodable profile row: %s", exc)
                    continue
                key = (row["model"], str(row["phase"]), row["pool"], row["variant"])
                if key == (model, Phase.PREFILL.value, pool, variant) and row["source"] == source.value \
                        and row["batch_curve"]:
                    if best is None or row["updated_at"] >= best["updated_at"]:
                        best = row
    except Exception as exc:
        log.info("no prefill profile for pool %r (%s); the configured token budget stays", pool, exc)
    finally:
        consumer.close()
    return [] if best is None else [(p["batch_size"], p["tokens_per_s"]) for p in best["batch_curve"]]
