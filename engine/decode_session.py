"""Continuous-batching decode session on the torch executor.

Life of a sequence: ``add(DecodeRequest)`` checks the KV against the model (``KVMeta``), admits it
against the context and the free blocks of the session's paged KV pool (``can_add`` is the
side-effect-free predicate), and copies its prompt KV into blocks of the ``PagedKV`` pool
(reserving the blocks ``max_tokens`` may need, so it never has to be preempted). If its first token is already EOS or
``max_tokens == 1`` it is finished at once and handed back by the next ``step()``. Every
``step()`` runs one forward pass over all running rows (each at its own position), appends one
greedy token per row, and returns the sequences that hit EOS or ``max_tokens``; their blocks are
freed immediately, so a new sequence may join before the next step. The pool is sized once:
``kv_budget_bytes`` of the executor, at most ``max_batch`` sequences of the model's full context. A request carrying a
``TokenProbe`` (drift canaries) is fed its forced tokens instead of its greedy choices and
leaves with one ``PositionTrace`` per position; the other rows of the batch are unaffected.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from phaseroute.engine.errors import KVBudgetError, KVFormatError
from phaseroute.engine.kv_cache import DEFAULT_BLOCK_SIZE, PagedKV
from phaseroute.engine.protocol import DecodeRequest, FinishedSequence, PositionTrace, StepStats, TokenLogprobs, TokenProbe

if TYPE_CHECKING:
    from phaseroute.engine.torch_backend import TorchExecutor


@dataclass
class _Running:
    request_id: str
    prompt_len: int
    max_tokens: int
    joined_at: float
    tokens: list[int]
    steps: int = 0
    logprobs: list[TokenLogprobs] | None = field(default=None)
    probe: TokenProbe | None = None  # drift canaries: forced tokens and per-position traces
    trace: list[PositionTrace] | None = None


class TorchDecodeSession:
    """See the module docstring. Not thread-safe: one session per worker loop."""

    def __init__(
        self, executor: TorchExecutor, max_batch: int = 64, return_logprobs: int = 0, ignore_eos: bool = False,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch} must be >= 1")
        self.executor, self.max_batch, self.return_logprobs = executor, max_batch, return_logprobs
        self.stop_ids = frozenset() if ignore_eos else executor.eos_token_ids  # ignore_eos: profiling only
        block_bytes = executor.kv_bytes_per_token() * block_size
        per_sequence = -(-executor.max_context // block_size)
        num_blocks = min(executor.kv_budget_bytes // block_bytes, max_batch * per_sequence)
        if num_blocks < 1:
            raise KVBudgetError(f"KV budget {executor.kv_budget_bytes} bytes holds no block of {block_size} tokens ({block_bytes} bytes)")
        self.kv = PagedKV(
            executor.num_layers, executor.kv_heads, executor.head_dim, executor.kv_dtype, executor.config.device,
            num_blocks=num_blocks, block_size=block_size,
        )
        self.seqs: list[_Running] = []  # index == row in self.kv
        self._joined = 0  # sequence ids in the pool are join counters (a request id may come twice)
        self.done_at_join: list[FinishedSequence] = []
        self.stats = StepStats()

    def running(self) -> int:
        """Sequences not yet handed back by ``step()`` (rows in flight + finished at join)."""
        return len(self.seqs) + len(self.done_at_join)

    def rows(self) -> int:
        """Sequences occupying a KV row (the batch size of the next step)."""
        return len(self.seqs)

    def kv_bytes_allocated(self) -> int:
        """Bytes of the blocks holding tokens now."""
        return self.kv.allocated_bytes()

    def kv_free_bytes(self) -> int:
        """Bytes of the blocks a new sequence can get (neither taken nor reserved)."""
        return self.kv.free_bytes()

    def kv_capacity_bytes(self) -> int:
        """Bytes of the whole preallocated block pool."""
        return self.kv.capacity_bytes()

    def can_add(self, total_tokens: int) -> bool:
        """Whether a sequence needing ``total_tokens`` KV slots (prompt + max_tokens) fits now."""
        if len(self.seqs) >= self.max_batch or total_tokens > self.executor.max_context:
            return False
        return self.kv.can_join(total_tokens)

    def add(self, request: DecodeRequest) -> None:
        meta = request.kv.meta
        self.check_request(request)
        self.executor.check_admission(meta.prompt_len, request.max_tokens, request.request_id)
        total = meta.prompt_len + request.max_tokens
        first_lp = [request.first_logprobs] if (self.return_logprobs and request.first_logprobs) else ([] if self.return_logprobs else None)
        seq = _Running(request.request_id, meta.prompt_len, request.max_tokens, time.perf_counter(), [request.first_token],
                       logprobs=first_lp)
        if request.probe is not None:
            seq.probe = request.probe
            seq.trace = [request.first_trace] if request.first_trace is not None else []
        if request.first_token in self.stop_ids or request.max_tokens <= 1:
            self.done_at_join.append(self._finish(seq))
            return
        if not self.can_add(total):
            blocks = self.kv.blocks
            raise KVBudgetError(
                f"request {request.request_id!r} cannot join: {len(self.seqs)}/{self.max_batch} rows running, "
                f"it needs {blocks.blocks_for(total)} KV blocks of {blocks.block_size} tokens ({total} tokens), "
                f"{blocks.free_blocks} of {blocks.num_blocks} are free"
            )
        self._joined += 1
        self.kv.join(str(self._joined), request.kv.keys, request.kv.values, meta.prompt_len, total)
        self.seqs.append(seq)

    def step(self) -> list[FinishedSequence]:
        finished, self.done_at_join = self.done_at_join, []
        if not self.seqs:
            return finished
        started = time.perf_counter()
        logits = self._forward()
        greedy = logits.argmax(dim=-1).tolist()
        next_tokens = [s.probe.forced(len(s.tokens), g) if s.probe else g for s, g in zip(self.seqs, greedy)]
        self.kv.advance()
        logprobs = self._logprobs(logits, next_tokens) if self.return_logprobs else None
        traces = self._traces(logits, greedy)
        leaving = []
        for row, (seq, token) in enumerate(zip(self.seqs, next_tokens)):
            if seq.trace is not None:
                seq.trace.append(traces[row])
            seq.tokens.append(token)
            seq.steps += 1
            if logprobs is not None and seq.logprobs is not None:
                seq.logprobs.append(logprobs[row])
            if token in self.stop_ids or len(seq.tokens) >= seq.max_tokens:
                leaving.append(row)
        for row in reversed(leaving):  # highest first: the row moved into `row` is never a leaving one
            finished.append(self._finish(self.seqs[row]))
            moved = self.kv.leave(row)
            last = self.seqs.pop()
            if moved is not None:
                self.seqs[row] = last
        elapsed = time.perf_counter() - started
        self.stats.steps += 1
        self.stats.tokens += len(next_tokens)
        self.stats.busy_s += elapsed
        self.stats.max_batch_seen = max(self.stats.max_batch_seen, len(next_tokens))
        self.stats.step_latencies_s.append(elapsed)
        return finished

    def _forward(self) -> torch.Tensor:
        ex = self.executor
        cache = self.kv.step_cache()
        input_ids = torch.tensor([[s.tokens[-1]] for s in self.seqs], dtype=torch.long, device=ex.device)
        with torch.inference_mode():
            hidden = ex.decoder(
                input_ids=input_ids,
                position_ids=cache.positions[:, None],
                use_cache=True,
                **{ex.cache_kw: cache},
                # one row: contiguous KV, no mask (generate()'s kernel path); else the paged attention,
                # its 4D mask passed through by transformers untouched
                **({} if cache.contiguous else {"attention_mask": cache.valid, "paged_owner": cache.owner}),
            ).last_hidden_state
            logits: torch.Tensor = ex.lm_head(hidden[:, -1:, :])[:, 0].float()
        ex._sync()
        return logits

    def _logprobs(self, logits: torch.Tensor, chosen: list[int]) -> list[TokenLogprobs]:
        lp = torch.log_softmax(logits, dim=-1)
        values, indices = lp.topk(self.return_logprobs, dim=-1)
        picked = lp[torch.arange(len(chosen)), torch.tensor(chosen)].tolist()
        return [
            TokenLogprobs(tok, picked[i], tuple(indices[i].tolist()), tuple(values[i].tolist()))
            for i, tok in enumerate(chosen)
        ]

    def _traces(self, logits: torch.Tensor, greedy: list[int]) -> dict[int, PositionTrace]:
        """Per probed row: the model's own top-1 and the log-probs of the probe ids at this position."""
        rows = [row for row, seq in enumerate(self.seqs) if seq.probe is not None]
        if not rows:
            return {}
        lp = torch.log_softmax(logits[rows], dim=-1)
        out = {}
        for i, row in enumerate(rows):
            seq = self.seqs[row]
            ids = seq.probe.ids_at(len(seq.tokens))  # type: ignore[union-attr]
            probed = tuple(lp[i, list(ids)].tolist()) if ids else ()
            out[row] = PositionTrace(greedy[row], float(lp[i, greedy[row]]), probed)
        return out

    def _finish(self, seq: _Running) -> FinishedSequence:
        reason = "stop" if seq.tokens[-1] in self.stop_ids else "length"
        return FinishedSequence(
            seq.request_id, seq.tokens, self.executor.decode_text(seq.tokens), reason,
            seq.prompt_len, seq.steps, time.perf_counter() - seq.joined_at, seq.logprobs, seq.trace,
        )

    def check_request(self, request: DecodeRequest) -> None:
        """KVFormatError unless the request's KV is of this session's model, dtype and layout."""
        meta, ex = request.kv.meta, self.executor
        want = (ex.model_name, ex.config.dtype, ex.num_layers, ex.kv_heads, ex.head_dim)
        got = (meta.model, meta.dtype, meta.num_layers, meta.kv_heads, meta.head_dim)
        if got != want:
            raise KVFormatError(
                f"request {request.request_id!r}: KV is (model, dtype, layers, kv_heads, head_dim)={got}, "
                f"this session runs {want}"
            )
        if request.first_token != meta.first_token:
            raise KVFormatError(f"request {request.request_id!r}: first_token {request.first_token} != KV meta {meta.first_token}")
