"""The executor protocol and the plain data that crosses it.

A request's life through the engine:

1. The caller hands ``Executor.prefill`` a list of ``PrefillItem`` (plain data: what to run).
   Every item is checked against the model's context and the KV memory budget *before* any
   compute (``AdmissionError`` names the numbers).
2. Prefill returns one ``PrefillResult`` per item: a ``KVCache`` (per-layer keys/values of the
   prompt plus ``KVMeta``), the first generated token and ``PhaseTimings``.
3. Disaggregated path: ``kv_codec.encode(kv)`` -> ``KVStore.put`` -> (another process)
   ``KVStore.get`` -> ``kv_codec.decode`` (``KVIntegrityError`` on any corruption).
   Colocated path: the ``KVCache`` goes straight to the decode session.
4. ``Executor.decode_session()`` returns a ``DecodeSession``: ``add(DecodeRequest)`` at any
   time, ``step()`` runs one decode step for every running sequence and returns the
   ``FinishedSequence`` objects that ended (EOS or ``max_tokens``) at that step.

``max_tokens`` counts every generated token, the first one from prefill included (as
``generate(max_new_tokens=...)`` does). Token lists include the EOS token when it ended the
sequence; ``text`` is decoded without special tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

KV_LAYOUT_VERSION = 1


@dataclass(frozen=True)
class PrefillItem:
    """One request to prefill. Give exactly one of ``token_ids``, ``messages`` or ``prompt``.

    ``messages`` are OpenAI-style ``[{"role": ..., "content": ...}]`` and go through the
    model's chat template (with the generation prompt appended); ``prompt`` is raw text.
    """

    request_id: str
    max_tokens: int
    token_ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, str], ...] | None = None
    prompt: str | None = None
    return_logprobs: int = 0  # top-k log-probs of the first token (0 = none)
    probe: TokenProbe | None = None  # drift canaries: force the first token, trace position 0


@dataclass(frozen=True)
class TokenProbe:
    """Per-request teacher forcing and tracing, for quality-drift canaries.

    At generated position ``i`` (0 = the token prefill produces) the engine feeds
    ``forced_tokens[i]`` instead of its own greedy choice (while ``i < len(forced_tokens)``;
    greedy afterwards) and records a ``PositionTrace``: its own argmax and the log-probs of
    ``probe_ids[i]`` (empty when ``i >= len(probe_ids)``). An empty ``forced_tokens`` traces a
    free greedy run.
    """

    forced_tokens: tuple[int, ...] = ()
    probe_ids: tuple[tuple[int, ...], ...] = ()

    def forced(self, position: int, greedy: int) -> int:
        return self.forced_tokens[position] if position < len(self.forced_tokens) else greedy

    def ids_at(self, position: int) -> tuple[int, ...]:
        return self.probe_ids[position] if position < len(self.probe_ids) else ()


@dataclass(frozen=True)
class PositionTrace:
    """What the model said at one generated position: its own top-1 and the probed log-probs."""

    argmax_id: int
    argmax_logprob: float
    probe_logprobs: tuple[float, ...] = ()


@dataclass(frozen=True)
class PhaseTimings:
    """Seconds spent, measured with ``time.perf_counter`` in the executing process."""

    tokenize_s: float = 0.0
    compute_s: float = 0.0  # the forward pass(es), synchronized on CUDA
    batch_size: int = 1
    batch_tokens: int = 0  # real (unpadded) tokens in the batch this item ran in
    padded_tokens: int = 0  # batch_size x longest prompt


@dataclass(frozen=True)
class KVMeta:
    """What a KV blob says about itself; checked on decode and on join."""

    model: str
    dtype: str  # torch dtype name without "torch.", e.g. "float32"
    prompt_len: int
    first_token: int
    num_layers: int
    kv_heads: int
    head_dim: int
    layout_version: int = KV_LAYOUT_VERSION
    request_id: str = ""
    variant: str = ""

    @property
    def bytes_per_token(self) -> int:
        return kv_bytes_per_token(self.num_layers, self.kv_heads, self.head_dim, dtype_bytes(self.dtype))

    @property
    def payload_bytes(self) -> int:
        """The exact KV formula: layers x 2 x kv_heads x head_dim x bytes x tokens."""
        return self.bytes_per_token * self.prompt_len


@dataclass
class KVCache:
    """A request's prompt KV: per layer, keys and values shaped ``[kv_heads, tokens, head_dim]``."""

    keys: list[Any]  # torch.Tensor per layer
    values: list[Any]
    meta: KVMeta


@dataclass(frozen=True)
class TokenLogprobs:
    """Log-prob of the chosen token and the top-k alternatives at one generated position."""

    token_id: int
    logprob: float
    top_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass
class PrefillResult:
    request_id: str
    kv: KVCache
    first_token: int
    prompt_len: int
    timings: PhaseTimings
    first_logprobs: TokenLogprobs | None = None
    first_trace: PositionTrace | None = None  # with PrefillItem.probe


@dataclass(frozen=True)
class DecodeRequest:
    """A sequence joining a decode session (``first_token`` is the one prefill produced)."""

    request_id: str
    kv: KVCache
    first_token: int
    max_tokens: int
    first_logprobs: TokenLogprobs | None = None
    probe: TokenProbe | None = None  # forced tokens / traces for positions >= 1
    first_trace: PositionTrace | None = None  # position 0's trace, from prefill


@dataclass
class FinishedSequence:
    request_id: str
    token_ids: list[int]  # every generated token, the prefill one first
    text: str
    finish_reason: str  # "stop" (EOS) or "length" (max_tokens)
    prompt_len: int
    steps: int  # decode steps this sequence took part in
    decode_s: float  # from join to finish
    # with return_logprobs: one entry per token; it starts at token_ids[0] when the DecodeRequest
    # carried first_logprobs (from prefill), else at token_ids[1]
    logprobs: list[TokenLogprobs] | None = None
    # with DecodeRequest.probe: one trace per token from token_ids[0] (first_trace) or token_ids[1]
    trace: list[PositionTrace] | None = None


@dataclass
class StepStats:
    """Counters of one decode session, updated every step."""

    steps: int = 0
    tokens: int = 0
    busy_s: float = 0.0
    max_batch_seen: int = 0
    step_latencies_s: list[float] = field(default_factory=list)


@runtime_checkable
class DecodeSession(Protocol):
    """Continuous batching: sequences join at any step and leave on EOS or max_tokens."""

    stats: StepStats

    def can_add(self, total_tokens: int) -> bool: ...
    def check_request(self, request: DecodeRequest) -> None: ...  # KVFormatError if its KV cannot join
    def add(self, request: DecodeRequest) -> None: ...
    def step(self) -> list[FinishedSequence]: ...
    def running(self) -> int: ...  # not yet returned by step(); loop `while running(): step()`
    def rows(self) -> int: ...  # batch size of the next step


@runtime_checkable
class Executor(Protocol):
    """One backend configured as one pool variant. Registered in ``registry.BACKENDS``."""

    model_name: str
    variant: str

    @property
    def max_context(self) -> int: ...
    def kv_bytes_per_token(self) -> int: ...
    def count_tokens(self, text: str) -> int: ...
    def encode_item(self, item: PrefillItem) -> list[int]: ...
    def check_admission(self, prompt_tokens: int, max_tokens: int, request_id: str = "") -> None: ...
    def prefill(self, items: list[PrefillItem]) -> list[PrefillResult]: ...
    def decode_session(self, max_batch: int = 64, return_logprobs: int = 0) -> DecodeSession: ...
    def decode_text(self, token_ids: list[int]) -> str: ...


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a dtype name ("float32", "bfloat16", "float16")."""
    sizes = {"float32": 4, "bfloat16": 2, "float16": 2}
    if dtype not in sizes:
        raise ValueError(f"unsupported KV dtype {dtype!r}; supported: {sorted(sizes)}")
    return sizes[dtype]


def kv_bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, elem_bytes: int) -> int:
    """KV bytes one token occupies: layers x 2 (K and V) x kv_heads x head_dim x bytes."""
    return num_layers * 2 * kv_heads * head_dim * elem_bytes
