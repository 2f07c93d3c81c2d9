"""The handler of prefill, decode and colocated workers: which stages run, and what each
finished item produces.

Life of a request through a worker of pool P:
- ``prefill_work`` (topic ``prefill.P``): micro-batched prefill. Colocated work (``colocated``
  true, on a worker that also decodes) joins this worker's decode batch with no KV transfer.
  On a worker that also decodes, while sequences are decoding the prefill batch runs in
  chunks of ``prefill_chunk_tokens`` with one decode step after each chunk (chunked prefill:
  decode never waits for a whole prefill); with nothing decoding it runs in one pass.
  Otherwise the KV blob goes to the KV store and the worker emits ``kv_ready`` (location,
  bytes, checksum, first token, timings) and, when the router already chose the decode pool,
  the ``decode_work`` for ``decode.<that pool>`` — both before its offset is committed.
- ``decode_work`` (topic ``decode.P``): the KV is fetched (measured), checked, and the sequence
  joins the continuous batch; at EOS or ``max_tokens`` a ``result`` is emitted.
- A failed attempt (KV corrupt or missing) emits ``attempt_failed`` for the tracker to retry
  elsewhere; impossible work (prompt beyond the context, a model the pool lacks) goes to the
  dead-letter topic with the engine's reason, and the worker keeps running.
- A copy of a request this worker is already running (a speculative copy or a replay, same
  request id: the dispatcher sends every attempt of a request to the partition it chose first,
  ``streams/pool_partitions.py``, so copies land on the same partition and worker)
  is done at once with no output: the running attempt answers for it, and running it twice in
  one process could never finish sooner (``duplicates_skipped`` counts them).
Every output carries a deterministic key and attempt id, so a replay overwrites, never adds.
Drift canaries (``canary`` set, tenant ``_canary``) take exactly this path; their ``canary``
field and trace ride along on ``decode_work`` and ``result``, and their results go to
``canary.results`` (the drift monitor) instead of ``results``. ``KVBitflips`` is fault
injection for tests and drills: it corrupts the blobs this worker hands over (CRC recomputed,
so every integrity check passes) and the damage can only show up as drift.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import logging
import random
import time
from dataclasses import dataclass
from typing import Any

from phaseroute.consumers.decode_stage import DecodeStage, Joining, blob_checksum, trace_to_avro
from phaseroute.consumers.handler import Completion, Output, WorkItem
from phaseroute.consumers.prefill_budget import PREFILL_CHUNK_TOKENS
from phaseroute.consumers.prefill_stage import MicroBatchLimits, PrefillStage
from phaseroute.consumers.telemetry_records import BatchCounter, WorkerTag
from phaseroute.consumers.worker_defaults import MAX_DECODE_BATCH
from phaseroute.engine import kv_codec
from phaseroute.engine.errors import EngineError, KVFormatError, KVIntegrityError, KVNotFoundError
from phaseroute.engine.protocol import FinishedSequence, KVCache, PrefillResult
from phaseroute.infra.topics import ATTEMPTS_FAILED, CANARY_RESULTS, KV_READY, RESULTS, decode_topic
from phaseroute.streams.policy.lifecycle import attempt_id
from phaseroute.streams.policy.types import Phase

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVBitflips:
    """Fault injection: flip each bit of a handed-over prompt KV with probability ``rate`` (for
    ``to_pool`` only, or every decode pool) before it is encoded, so the codec frames and
    checksums the damaged values and every integrity check passes. Deterministic per attempt
    id and ``seed``."""

    rate: float
    to_pool: str | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"KV bit-flip rate {self.rate!r} must be in [0, 1]")

    def applies(self, decode_pool: str | None) -> bool:
        return self.rate > 0 and (self.to_pool is None or self.to_pool == decode_pool)

    def corrupt(self, kv: KVCache, attempt: str) -> tuple[KVCache, int]:
        """A damaged copy of ``kv`` (the original is untouched) and the number of bits flipped."""
        import torch

        tensors = [t.detach().to("cpu").contiguous().clone() for t in (*kv.keys, *kv.values)]
        raw = [t.reshape(-1).view(torch.uint8).numpy() for t in tensors]  # views: flipping them flips the tensors
        sizes = [r.size * 8 for r in raw]
        bits, rng = sum(sizes), random.Random(f"{self.seed}/{attempt}")
        flips = max(0, min(bits, round(bits * self.rate + rng.gauss(0.0, (bits * self.rate) ** 0.5))))
        starts = list(itertools.accumulate(sizes, initial=0))
        for bit in rng.sample(range(bits), flips):
            i = bisect.bisect_right(starts, bit) - 1
            offset = bit - starts[i]
            raw[i][offset >> 3] ^= 1 << (offset & 7)
        n = kv.meta.num_layers
        return KVCache(tensors[:n], tensors[n:], kv.meta), flips


@dataclass(frozen=True)
class WorkerSpec:
    pool: str
    worker_id: str
    variant: str
    prefill: bool
    decode: bool
    limits: MicroBatchLimits = MicroBatchLimits()
    max_decode_batch: int = MAX_DECODE_BATCH
    prefill_chunk_tokens: int = PREFILL_CHUNK_TOKENS  # colocated: padded prompt tokens per prefill chunk between decode steps
    efficient_prefill_batch: int | None = None  # from the pool's profile (prefill_budget); None: limits only
    kv_bitflips: KVBitflips | None = None  # fault injection (tests, drills): corrupt handed-over KV


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


class PhaseHandler:
    """Prefill and/or decode stages behind the loop's Handler protocol."""

    def __init__(self, executor: Any, store: Any, spec: WorkerSpec) -> None:
        if not (spec.prefill or spec.decode):
            raise ValueError(f"worker {spec.worker_id!r} must run prefill, decode or both")
        self.executor = executor
        self.store = store
        self.spec = spec
        self.tag = WorkerTag(spec.pool, spec.worker_id, executor.model_name, spec.variant)
        batches = BatchCounter(spec.worker_id)
        self.prefill = PrefillStage(executor, self.tag, batches, spec.limits, spec.efficient_prefill_batch) if spec.prefill else None
        self.decode = DecodeStage(executor, store, self.tag, batches, spec.max_decode_batch) if spec.decode else None
        self._telemetry: list[Output] = []
        self.duplicates_skipped = 0

    # -- Handler protocol -------------------------------------------------------------
    def capacity(self) -> int:
        return (self.prefill.room() if self.prefill else 0) + (self.decode.room() if self.decode else 0)

    def batch_ready(self, now: float) -> bool:
        return bool((self.prefill and self.prefill.ready(now)) or (self.decode and self.decode.in_flight()))

    def due_in(self, now: float) -> float:
        return self.prefill.due_in(now) if self.prefill and self.prefill.waiting else 3600.0

    def in_flight(self) -> int:
        return (self.prefill.in_flight() if self.prefill else 0) + (self.decode.in_flight() if self.decode else 0)

    def admit(self, items: list[WorkItem]) -> list[Completion]:
        done = []
        for item in items:
            refused = self._admit_one(item)
            if refused is not None:
                done.append(refused)
        return done

    def step(self) -> list[Completion]:
        done: list[Completion] = []
        if self.prefill and self.prefill.ready(time.time()):
            decoding = self.decode is not None and self.decode.in_flight() > 0
            ran = self.prefill.run(self.spec.prefill_chunk_tokens if decoding else None)
            if ran is not None:
                results, telemetry = ran
                self._telemetry.append(telemetry)
                for item, result in results:
                    finished = self._after_prefill(item, result)
                    if finished is not None:
                        done.append(finished)
        if self.decode and self.decode.in_flight():
            done.extend(Completion(j.item, [self._result(j, seq)]) for j, seq in self.decode.step())
            twins = self.decode.take_twins()
            self.duplicates_skipped += len(twins)
            done.extend(Completion(j.item) for j in twins)
        return done

    def drop(self, tps: list[tuple[str, int]]) -> int:
        return (self.prefill.drop(tps) if self.prefill else 0) + (self.decode.drop(tps) if self.decode else 0)

    def telemetry(self) -> list[Output]:
        out, self._telemetry = self._telemetry, []
        return out + (self.decode.telemetry() if self.decode else [])

    def status(self) -> dict[str, Any]:
        """Heartbeat numbers; a decoding worker's free KV is its block pool's free blocks (not reserved)."""
        session = self.decode.session if self.decode else None
        return {
            "batch_in_flight": self.in_flight(),
            # the requests the control plane may have here at once: the decode batch, or the prompts
            # a prefill-only worker holds (a few micro-batches, so it picks near lengths and never idles a hop)
            "max_batch": self.spec.max_decode_batch if self.decode else self.spec.limits.held,
            "kv_free_bytes": session.kv_free_bytes() if session else self.executor.kv_budget_bytes,
            "kv_capacity_bytes": session.kv_capacity_bytes() if session else self.executor.kv_budget_bytes,
        }

    # -- the work ------------------------------------------------------------------------
    def _running_ids(self) -> set[str]:
        return (self.prefill.request_ids() if self.prefill else set()) | (self.decode.request_ids() if self.decode else set())

    def _admit_one(self, item: WorkItem) -> Completion | None:
        if item.kind in ("prefill_work", "decode_work") and item.record.get("request_id") in self._running_ids():
            log.info("%s %s: request %s already runs here; this copy is done without output",
                     self.spec.worker_id, item.kind, item.record["request_id"])
            self.duplicates_skipped += 1
            return Completion(item)
        if item.kind == "prefill_work":
            if self.prefill is None:
                return Completion(item, dead_letter_reason=f"pool {self.spec.pool!r} does not prefill", error_class="WrongPhase")
            return self.prefill.accept(item)
        if item.kind == "decode_work":
            if self.decode is None:
                return Completion(item, dead_letter_reason=f"pool {self.spec.pool!r} does not decode", error_class="WrongPhase")
            try:
                self.decode.enqueue(self.decode.fetch(item))
            except (KVIntegrityError, KVNotFoundError, KVFormatError) as exc:
                return Completion(item, [self._attempt_failed(item, Phase.DECODE, exc, retryable=True)])
            except EngineError as exc:
                return Completion(item, dead_letter_reason=str(exc), error_class=type(exc).__name__)
            return None
        return Completion(item, dead_letter_reason=f"a worker cannot run {item.kind!r} records", error_class="WrongKind")

    def _after_prefill(self, item: WorkItem, result: PrefillResult) -> Completion | None:
        record = item.record
        context = {"prefill_pool": self.spec.pool, "prefill_time_s": result.timings.compute_s,
                   "kv_transfer_s": 0.0, "kv_bytes": 0, "colocated": True}
        if record.get("colocated") and self.decode is not None:
            self.decode.enqueue(self.decode.local(item, result.kv, result.first_token, context, result.first_trace))
            return None  # completes when its decode finishes
        if not record.get("decode_pool") and record.get("colocated"):
            return Completion(item, dead_letter_reason=(
                f"colocated work sent to prefill-only pool {self.spec.pool!r} without a decode_pool"
            ), error_class="WrongPhase")
        return Completion(item, self._hand_over(item, result))

    def _hand_over(self, item: WorkItem, result: PrefillResult) -> list[Output]:
        """Store the KV blob; announce it (kv.ready) and, if chosen, send the decode work."""
        record = item.record
        kv, fault = result.kv, self.spec.kv_bitflips
        if fault is not None and fault.applies(record.get("decode_pool")):
            kv, flipped = fault.corrupt(kv, record["attempt_id"])
            log.warning("fault injection: %d KV bits flipped for %s -> %s", flipped, record["attempt_id"], record.get("decode_pool"))
        parts = kv_codec.encode_parts(kv)
        started = time.time()
        key = "kv/" + hashlib.sha256(record["attempt_id"].encode()).hexdigest()[:40]
        location = self.store.put(key, parts)
        put_s = time.time() - started
        size = sum(len(memoryview(p).cast("B")) for p in parts)
        checksum = "crc32:" + bytes(parts[-1]).hex()
        now = time.time()
        common = {k: record[k] for k in ("request_id", "job_id", "tenant", "custom_id", "model", "max_tokens",
                                           "sampling", "priority", "deadline", "quality_tier")}
        ready = {**common, "attempt_id": record["attempt_id"], "attempt": record["attempt"],
                 "prefill_pool": self.spec.pool, "worker_id": self.spec.worker_id, "variant": self.spec.variant,
                 "kv_location": location, "kv_bytes": size, "kv_checksum": checksum, "kv_layout_version": result.kv.meta.layout_version,
                 "prompt_tokens": result.prompt_len, "first_token": result.first_token,
                 "decode_pool": record.get("decode_pool"), "prefill_time_s": result.timings.compute_s + put_s,
                 "queue_wait_s": max(0.0, item.received_at - record["dispatched_at"] / 1000), "created_at": _ms(now)}
        outputs = [Output(KV_READY, record["job_id"], "kv_ready", ready)]
        if record.get("decode_pool"):
            work = {**common, "attempt_id": attempt_id(record["request_id"], Phase.DECODE, record["attempt"]),
                    "attempt": record["attempt"], "pool": record["decode_pool"], "source_pool": self.spec.pool,
                    "prefill_attempt_id": record["attempt_id"], "kv_location": location, "kv_bytes": size,
                    "kv_checksum": checksum, "kv_layout_version": result.kv.meta.layout_version,
                    "prompt_tokens": result.prompt_len, "first_token": result.first_token,
                    "prefill_time_s": result.timings.compute_s, "dispatched_at": _ms(now)}
            if record.get("canary") is not None:
                work["canary"] = record["canary"]
                work["canary_trace"] = trace_to_avro([result.first_trace]) if result.first_trace is not None else None
            outputs.append(Output(decode_topic(record["decode_pool"]), record["request_id"], "decode_work", work))
        return outputs

    def _result(self, joined: Joining, seq: FinishedSequence) -> Output:
        record = joined.item.record
        ctx = joined.context
        result = {
            "request_id": record["request_id"], "job_id": record["job_id"], "tenant": record["tenant"],
            "custom_id": record["custom_id"], "attempt_id": record["attempt_id"], "attempt": record["attempt"],
            "model": record["model"], "status": "OK", "output_text": seq.text, "output_token_ids": list(seq.token_ids),
            "finish_reason": "STOP" if seq.finish_reason == "stop" else "LENGTH",
            "prompt_tokens": seq.prompt_len, "completion_tokens": len(seq.token_ids),
            "prefill_pool": ctx["prefill_pool"], "decode_pool": self.spec.pool, "colocated": ctx["colocated"],
            "prefill_time_s": ctx["prefill_time_s"], "decode_time_s": seq.decode_s,
            "kv_transfer_s": ctx["kv_transfer_s"], "kv_bytes": ctx["kv_bytes"], "error": None,
            "completed_at": _ms(time.time()), "canary": record.get("canary"),
            "canary_trace": trace_to_avro(seq.trace) if seq.trace is not None else None,
        }
        # drift canaries' results go to the drift monitor, not to the result sink
        topic = CANARY_RESULTS if record.get("canary") is not None else RESULTS
        return Output(topic, record["job_id"], "result", result)

    def _attempt_failed(self, item: WorkItem, phase: Phase, exc: Exception, retryable: bool) -> Output:
        record = item.record
        failed = {
            "attempt_id": record["attempt_id"], "request_id": record["request_id"], "job_id": record["job_id"],
            "tenant": record["tenant"], "attempt": record["attempt"], "phase": phase.name, "pool": self.spec.pool,
            "worker_id": self.spec.worker_id, "error_class": type(exc).__name__, "error": str(exc),
            "retryable": retryable, "at": _ms(time.time()),
        }
        return Output(ATTEMPTS_FAILED, record["job_id"], "attempt_failed", failed)


__all__ = ["KVBitflips", "PhaseHandler", "WorkerSpec", "blob_checksum"]
