"""Decode stage of a worker: the continuous batch that requests join and leave at any step.

Life of a sequence here: a ``decode_work`` item arrives with the KV's location; ``fetch``
reads the blob from the KV store (its bytes and seconds are the measured transfer cost),
checks the checksum the prefill worker announced, and decodes it (``KVIntegrityError`` on any
corruption: the attempt fails, retryably, and nothing is decoded). A colocated worker hands
its prefill KV over directly, with no store in between. The sequence waits until the session
has a free row and KV memory, joins, and leaves at EOS or ``max_tokens``; each ``step`` is
one forward pass over every running sequence. A FORCED drift canary joins with its
``TokenProbe`` and the position-0 trace its prefill produced (``canary_trace`` on the work),
and leaves with the trace of every position (``trace_to_avro``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from phaseroute.consumers.handler import Output, WorkItem
from phaseroute.consumers.prefill_stage import probe_of
from phaseroute.consumers.telemetry_records import BatchCounter, DecodeWindow, WorkerTag, telemetry_output
from phaseroute.engine import kv_codec
from phaseroute.engine.errors import KVIntegrityError
from phaseroute.engine.protocol import DecodeRequest, FinishedSequence, KVCache, PositionTrace

WINDOW_STEPS = 16  # decode steps summarized by one telemetry record


def blob_checksum(blob: bytes) -> str:
    """The checksum announced in kv.ready / decode_work: the blob's trailing CRC-32."""
    return "crc32:" + blob[-4:].hex()


def trace_to_avro(trace: list[PositionTrace]) -> dict[str, Any]:
    """A ``CanaryTrace`` record: per position the model's top-1 and the probed log-probs (flattened)."""
    return {"argmax_ids": [t.argmax_id for t in trace], "probe_logprobs": [v for t in trace for v in t.probe_logprobs]}


def first_trace_of(record: dict[str, Any]) -> PositionTrace | None:
    """Position 0's trace, which the prefill pool put on a FORCED canary's ``decode_work``."""
    trace = record.get("canary_trace")
    if not trace or not trace["argmax_ids"]:
        return None
    return PositionTrace(trace["argmax_ids"][0], 0.0, tuple(trace["probe_logprobs"]))


@dataclass
class Joining:
    """A sequence with its KV in memory, waiting for a row in the session."""

    item: WorkItem
    request: DecodeRequest
    context: dict[str, Any] = field(default_factory=dict)  # what the result record needs


class DecodeStage:
    """Owns one decode session and the sequences waiting to join it."""

    def __init__(self, executor: Any, store: Any, tag: WorkerTag, batches: BatchCounter, max_batch: int) -> None:
        self.executor = executor
        self.store = store
        self.tag = tag
        self.batches = batches
        self.max_batch = max_batch
        self.session = executor.decode_session(max_batch=max_batch)
        self.joining: list[Joining] = []
        self.running: dict[str, Joining] = {}  # request_id -> sequence in the session
        self.orphans: set[str] = set()  # running sequences whose partition was revoked
        self.twins: list[Joining] = []  # copies of a running sequence: done, the running one answers
        self.window = DecodeWindow()
        self.pending_telemetry: list[Output] = []

    def fetch(self, item: WorkItem) -> Joining:
        """Load the KV of a decode_work item (measured); raise KVIntegrityError, KVNotFoundError
        (also for a location outside this worker's store) or KVFormatError (KV this session cannot join)."""
        record = item.record
        started = time.time()
        blob = self.store.get(record["kv_location"])
        fetched = time.time() - started
        if blob_checksum(blob) != record["kv_checksum"] or len(blob) != record["kv_bytes"]:
            raise KVIntegrityError(
                f"KV blob at {record['kv_location']} has {len(blob)} bytes and checksum {blob_checksum(blob)}, "
                f"the prefill announced {record['kv_bytes']} bytes and {record['kv_checksum']}"
            )
        kv = kv_codec.decode(blob)
        self.executor.check_admission(kv.meta.prompt_len, record["max_tokens"], record["request_id"])
        if record.get("canary") is not None:  # drift canaries are never retried: keep no blobs of them
            self.store.delete(record["kv_location"])
        self.pending_telemetry.append(telemetry_output(
            self.tag, self.batches.next_id(), "TRANSFER", batch_size=1, tokens_in=kv.meta.prompt_len,
            kv_bytes=len(blob), kv_transfer_s=fetched, exec_time_s=fetched, step_latency_s=fetched,
            source_pool=record["source_pool"],
        ))
        context = {"kv_transfer_s": fetched, "kv_bytes": len(blob), "prefill_pool": record["source_pool"],
                   "prefill_time_s": record.get("prefill_time_s", 0.0), "colocated": False}
        request = DecodeRequest(record["request_id"], kv, record["first_token"], record["max_tokens"],
                                probe=probe_of(record), first_trace=first_trace_of(record))
        self.session.check_request(request)  # here, inside the handler's guard, not in a later step
        return Joining(item, request, context)

    def local(self, item: WorkItem, kv: KVCache, first_token: int, context: dict[str, Any],
              first_trace: PositionTrace | None = None) -> Joining:
        """A colocated sequence: the KV never leaves the process."""
        record = item.record
        request = DecodeRequest(record["request_id"], kv, first_token, record["max_tokens"], probe=probe_of(record),
                                first_trace=first_trace)
        return Joining(item, request, context)

    def enqueue(self, joining: Joining) -> None:
        self.joining.append(joining)

    def room(self) -> int:
        return max(0, self.max_batch - len(self.running) - len(self.joining))

    def in_flight(self) -> int:
        return len(self.running) + len(self.joining)

    def request_ids(self) -> set[str]:
        """Requests this stage will answer for (orphans of revoked partitions excluded)."""
        return {j.request.request_id for j in self.joining} | (set(self.running) - self.orphans)

    def take_twins(self) -> list[Joining]:
        """Copies that a running sequence answers for: their offsets are done, they produce nothing."""
        out, self.twins = self.twins, []
        return out

    def step(self) -> list[tuple[Joining, FinishedSequence]]:
        """Admit waiting sequences that fit, run one step, return the sequences that finished."""
        while self.joining:
            nxt = self.joining[0]
            rid = nxt.request.request_id
            if rid in self.running:  # a replay of a running sequence: its twin answers
                self.joining.pop(0)
                if rid in self.orphans:  # the running one lost its partition: it now answers for this copy
                    self.orphans.discard(rid)
                    self.twins.append(self.running[rid])
                    self.running[rid] = nxt
                else:
                    self.twins.append(nxt)
                continue
            if not self.session.can_add(nxt.request.kv.meta.prompt_len + nxt.request.max_tokens) and self.running:
                break
            self.joining.pop(0)
            self.session.add(nxt.request)
            self.running[nxt.request.request_id] = nxt
        batch = self.session.rows()  # the batch size of this step
        prompt_lens = [j.request.kv.meta.prompt_len for j in self.running.values()]
        started = time.time()
        finished = self.session.step()
        elapsed = time.time() - started
        if batch:
            self.window.add_step(batch, elapsed, prompt_lens)
        if self.window.steps >= WINDOW_STEPS or (not self.session.running() and self.window.steps):
            out = self.window.flush(self.tag, self.batches.next_id())
            if out is not None:
                self.pending_telemetry.append(out)
        done = []
        for seq in finished:
            joined = self.running.pop(seq.request_id)
            if seq.request_id in self.orphans:
                self.orphans.discard(seq.request_id)
                continue
            done.append((joined, seq))
        return done

    def drop(self, tps: list[tuple[str, int]]) -> int:
        before = len(self.joining)
        self.joining = [j for j in self.joining if j.item.tp not in tps]
        for request_id, joined in self.running.items():
            if joined.item.tp in tps:
                self.orphans.add(request_id)  # finishes in the session, its result is not produced
        return before - len(self.joining)

    def telemetry(self) -> list[Output]:
        out, self.pending_telemetry = self.pending_telemetry, []
        return out
