"""Prefill stage of a worker: micro-batches of prompts through the engine.

Life of a ``prefill_work`` item here: ``accept`` tokenizes the prompt and asks the engine
whether it can run at all (model loaded, prompt + max_tokens within the context, KV within
the memory budget); an impossible item is refused with the engine's reason (it goes to the
dead-letter topic). Accepted items wait until the waiting ones hold ``max_batch`` items or
``max_batch_tokens`` prompt tokens (the token budget: ``prefill_budget`` derives it from the
pool's measured profile), or the first has waited ``max_wait_s``; ``run`` then prefills one
micro-batch (``pick_batch``: the oldest waiting item and those nearest its length, within the
budget and two padding bounds, a share and what a join saves (``prefill_budget.PaddingRule``,
from this worker's batch times), since a batch computes every prompt at its longest one's length)
together (one batch = one telemetry record) and returns each item's KV, first token and
timings to the worker. The stage holds up to ``lookahead`` micro-batches' worth of prompts
(``MicroBatchLimits.held``, what a prefill-only worker's heartbeats offer the control plane), so
a batch is picked among several and the next one is waiting when one ends.
``run(chunk_tokens)`` runs only the next chunk of about that many padded tokens and returns None
until the batch's last chunk: a colocated worker calls it between decode steps, so its decode
batch never waits for a whole prefill. A FORCED drift canary (``canary`` set) carries a
``TokenProbe``: its first token is forced and position 0 is traced (``probe_of``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from phaseroute.consumers.handler import Completion, Output, WorkItem
from phaseroute.consumers.prefill_budget import PaddingRule, TokenBudget
from phaseroute.consumers.telemetry_records import BatchCounter, WorkerTag, telemetry_output
from phaseroute.consumers.worker_defaults import PREFILL_MAX_BATCH, PREFILL_MAX_BATCH_TOKENS, PREFILL_MAX_WAIT_S
from phaseroute.engine.errors import AdmissionError
from phaseroute.engine.protocol import PrefillItem, PrefillResult, TokenProbe
from phaseroute.schemas.enums import CanaryMode


def probe_of(record: dict[str, Any]) -> TokenProbe | None:
    """The engine probe of a FORCED canary's ``canary`` field; None for real work and GREEDY canaries."""
    canary = record.get("canary")
    if not canary or canary["mode"] != CanaryMode.FORCED:
        return None
    ids, width = canary["probe_token_ids"], canary["probe_width"]
    probe_ids = tuple(tuple(ids[i : i + width]) for i in range(0, len(ids), width)) if width > 0 else ()
    return TokenProbe(tuple(canary["forced_token_ids"]), probe_ids)


@dataclass(frozen=True)
class MicroBatchLimits:
    """Bounds of one micro-batch: items, prompt tokens, and how long the first item may wait."""

    max_batch: int = PREFILL_MAX_BATCH
    max_batch_tokens: int = PREFILL_MAX_BATCH_TOKENS
    max_wait_s: float = PREFILL_MAX_WAIT_S
    lookahead: int = 4
    """Micro-batches' worth of prompts the stage holds (``held``): ``pick_batch`` chooses among
    them, so near lengths find each other, and the next batch is here when one ends instead of
    a control-plane hop later."""

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_batch_tokens < 1 or self.max_wait_s < 0 or self.lookahead < 1:
            raise ValueError(f"invalid micro-batch limits {self}")

    @property
    def held(self) -> int:
        """Prompts the stage holds at most, waiting or running."""
        return self.max_batch * self.lookahead


MAX_PADDING_SHARE = 0.25
"""A micro-batch's padding (positions computed beyond each prompt's end) stays within this
share of its padded positions: prompts of very different lengths are not batched together."""


def pick_batch(lengths: list[int], max_items: int, budget_tokens: int,
               max_padding_share: float = MAX_PADDING_SHARE, max_added_padding: float | None = None) -> list[int]:
    """Indices (into ``lengths``, the waiting prompts' token counts, oldest first) of the next
    micro-batch: the oldest prompt always (so none waits behind newer ones for ever), then the
    others nearest its length (the older first on a tie) while the batch has at most
    ``max_items`` prompts and ``budget_tokens`` prompt tokens, its padding share stays within
    ``max_padding_share`` and (when given) no prompt adds more than ``max_added_padding`` padded
    positions (``prefill_budget.PaddingRule``). Returned oldest first."""
    if not lengths:
        return []
    head = lengths[0]
    chosen, tokens, longest = [0], head, head
    for i in sorted(range(1, len(lengths)), key=lambda j: (abs(lengths[j] - head), j)):
        n = lengths[i]
        wider = max(longest, n)
        if len(chosen) >= max_items or tokens + n > budget_tokens:
            break
        padded = wider * (len(chosen) + 1)
        if 1.0 - (tokens + n) / padded > max_padding_share:
            continue  # a prompt farther from the head's length than this one may still fit
        if max_added_padding is not None and padded - longest * len(chosen) - n > max_added_padding:
            continue
        chosen.append(i)
        tokens, longest = tokens + n, wider
    return sorted(chosen)


@dataclass
class _Waiting:
    item: WorkItem
    token_ids: list[int]


class PrefillStage:
    """Holds prefill work until its micro-batch is due, then runs it."""

    def __init__(self, executor: Any, tag: WorkerTag, batches: BatchCounter, limits: MicroBatchLimits,
                 efficient_batch: int | None = None) -> None:
        self.executor = executor
        self.tag = tag
        self.batches = batches
        self.limits = limits
        self.budget = TokenBudget(limits.max_batch_tokens, efficient_batch)
        self.padding = PaddingRule()
        self.waiting: list[_Waiting] = []
        self.first_at: float | None = None
        self.running: list[_Waiting] = []  # the batch of the prefill job in progress
        self.job: Any = None  # engine PrefillJob while a batch runs in chunks
        self.job_started = 0.0

    def accept(self, item: WorkItem) -> Completion | None:
        """Queue the item, or refuse it at once (a Completion with the reason)."""
        record = item.record
        if record["model"] != self.executor.model_name:
            return Completion(item, dead_letter_reason=(
                f"model {record['model']!r} is not loaded in pool {self.tag.pool!r} (it serves {self.executor.model_name!r})"
            ), error_class="ModelNotLoaded")
        try:
            ids = self.executor.encode_item(PrefillItem(record["request_id"], record["max_tokens"], prompt=record["prompt"]))
            self.executor.check_admission(len(ids), record["max_tokens"], record["request_id"])
        except AdmissionError as exc:
            return Completion(item, dead_letter_reason=str(exc), error_class=type(exc).__name__)
        if not self.waiting:
            self.first_at = time.time()
        self.waiting.append(_Waiting(item, ids))
        self.budget.observe(len(ids))
        return None

    def room(self) -> int:
        return max(0, self.limits.held - len(self.waiting) - len(self.running))

    def in_flight(self) -> int:
        return len(self.waiting) + len(self.running)

    def request_ids(self) -> set[str]:
        return {w.item.record["request_id"] for w in (*self.waiting, *self.running)}

    def due_in(self, now: float) -> float:
        """Seconds until the first waiting item has waited ``max_wait_s``."""
        return max(0.0, self.limits.max_wait_s - (now - (self.first_at or now)))

    def ready(self, now: float) -> bool:
        if self.job is not None:
            return True
        if not self.waiting:
            return False
        tokens = sum(len(w.token_ids) for w in self.waiting)
        full = len(self.waiting) >= self.limits.max_batch or tokens >= self.budget.tokens()
        return full or now - (self.first_at or now) >= self.limits.max_wait_s

    def run(self, chunk_tokens: int | None = None) -> tuple[list[tuple[WorkItem, PrefillResult]], Output] | None:
        """Prefill (the next chunk of) one micro-batch; its results and telemetry after the last chunk."""
        if self.job is None:
            self._start()
        results = self.job.advance(chunk_tokens)
        if results is None:
            return None
        batch, job = self.running, self.job
        self.running, self.job = [], None
        elapsed = time.time() - self.job_started
        lens = [len(w.token_ids) for w in batch]
        self.padding.observe(len(lens) * max(lens), job.compute_s)
        waits = [max(0.0, self.job_started - w.item.record["dispatched_at"] / 1000) for w in batch]
        telemetry = telemetry_output(
            self.tag, self.batches.next_id(), "PREFILL", batch_size=len(batch), tokens_in=sum(lens),
            tokens_out=len(batch), seq_len_mean=sum(lens) / len(lens), seq_len_max=max(lens),
            queue_wait_s=sum(waits) / len(waits), exec_time_s=job.compute_s, steps=job.chunks,
            step_latency_s=job.compute_s / job.chunks, step_latency_s_max=elapsed,
        )
        return [(w.item, r) for w, r in zip(batch, results)], telemetry

    def _start(self) -> None:
        """Take one micro-batch (``pick_batch``) off the queue and start its prefill job."""
        picked = pick_batch([len(w.token_ids) for w in self.waiting], self.limits.max_batch, self.budget.tokens(),
                            max_added_padding=self.padding.break_even_positions())
        batch = [self.waiting[i] for i in picked]
        taken = set(picked)
        self.waiting = [w for i, w in enumerate(self.waiting) if i not in taken]
        self.first_at = time.time() if self.waiting else None
        self.job_started = time.time()
        self.running = batch
        self.job = self.executor.start_prefill([
            PrefillItem(w.item.record["request_id"], w.item.record["max_tokens"], token_ids=tuple(w.token_ids),
                        probe=probe_of(w.item.record))
            for w in batch
        ])

    def drop(self, tps: list[tuple[str, int]]) -> int:
        before = self.in_flight()
        self.waiting = [w for w in self.waiting if w.item.tp not in tps]
        if any(w.item.tp in tps for w in self.running):  # the running batch is abandoned whole; the rest is retaken
            self.waiting = [w for w in self.running if w.item.tp not in tps] + self.waiting
            self.running, self.job = [], None
            self.first_at = time.time() if self.waiting else None
        return before - self.in_flight()
