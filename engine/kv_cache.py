"""Preallocated slot KV cache for continuous batching.

transformers' ``DynamicCache`` grows with ``torch.cat`` at every step, copying the whole cache
each time. Here every layer's keys and values live in two preallocated tensors shaped
``[layers, rows, kv_heads, seq_capacity, head_dim]``. A running sequence owns one row; a decode
step writes one token per row in place, at that row's own position, and attention reads a view
``[:rows, :, :kv_len]`` (no copy). Rows are kept dense: when a sequence leaves, the last row is
moved into its slot (one row copied, not the cache).

Capacity grows only when a joining sequence needs more rows or more tokens than allocated (rows
double up to the session's ``max_batch``; tokens grow to ``max(need, 1.5 x old)`` bounded by the
model's context), so a copy of the whole cache happens a logarithmic number of times over a
session, never per step. Memory is a rectangle: rows x the longest (prompt + max_tokens) among
the running sequences, so short sequences next to a long one waste slots (reported as KV bytes
per live token). ``shrink`` gives memory back when the batch drains (rows <= 1/4 of the capacity,
or the longest need <= 1/2 of it), copying only the live part. ``capacity_bytes`` is what the
admission check compares with the KV memory budget.

``StepCache`` adapts one decode step to transformers' ``Cache`` interface: ``update`` scatters the
new keys/values and returns the views, ``get_mask_sizes`` reports the key length.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

SEQ_ALIGN = 64


class SlotKV:
    """Dense rows of per-sequence KV, preallocated; one row per running sequence."""

    def __init__(
        self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: str,
        max_seq: int, max_rows: int, budget_bytes: int | None = None,
    ) -> None:
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim
        self.dtype, self.device = dtype, torch.device(device)
        self.max_seq, self.max_rows, self.budget_bytes = max_seq, max_rows, budget_bytes
        self.keys = torch.zeros((num_layers, 0, kv_heads, 0, head_dim), dtype=dtype, device=self.device)
        self.values = torch.zeros_like(self.keys)
        self.lengths: list[int] = []  # tokens stored per row
        self.needs: list[int] = []  # tokens each row may reach (prompt + max_tokens)
        self.grow_count = self.shrink_count = 0

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def row_capacity(self) -> int:
        return self.keys.shape[1]

    @property
    def seq_capacity(self) -> int:
        return self.keys.shape[3]

    def bytes_per_token(self) -> int:
        return self.num_layers * 2 * self.kv_heads * self.head_dim * self.keys.element_size()

    def capacity_bytes(self, rows: int | None = None, seq: int | None = None) -> int:
        """Bytes held for ``rows`` x ``seq`` slots (default: the current allocation)."""
        rows = self.row_capacity if rows is None else rows
        seq = self.seq_capacity if seq is None else seq
        return rows * seq * self.bytes_per_token()

    def planned_capacity(self, extra_rows: int, seq_needed: int) -> tuple[int, int]:
        """(rows, seq) the allocation would have after admitting ``extra_rows`` needing ``seq_needed``.

        Generous growth (rows x2, tokens x1.5) when it fits ``budget_bytes``, else the minimum.
        """
        rows = self.rows + extra_rows
        generous = (self._grow_rows(rows), self._grow_seq(seq_needed))
        if self.budget_bytes is None or self.capacity_bytes(*generous) <= self.budget_bytes:
            return generous
        return max(rows, self.row_capacity), max(self.seq_capacity, min(self.max_seq, _align(seq_needed)))

    def _grow_rows(self, rows: int) -> int:
        if rows <= self.row_capacity:
            return self.row_capacity
        return max(rows, min(self.max_rows, max(4, 2 * self.row_capacity)))

    def _grow_seq(self, seq: int) -> int:
        if seq <= self.seq_capacity:
            return self.seq_capacity
        return min(self.max_seq, max(_align(seq), _align(self.seq_capacity * 3 // 2)))

    def reserve(self, rows: int, seq: int) -> None:
        """Grow to at least ``rows`` x ``seq`` (one copy of the live part); no-op if it fits."""
        if rows <= self.row_capacity and seq <= self.seq_capacity:
            return
        self._reallocate(max(rows, self.row_capacity), max(seq, self.seq_capacity))
        self.grow_count += 1

    def shrink(self) -> bool:
        """Release memory the running rows cannot use any more; True if it reallocated."""
        need = max(self.needs, default=0)
        rows = self.row_capacity
        if 4 * self.rows <= rows and rows > 4:
            rows = max(4, 2 * self.rows) if self.rows else 0
        seq = self.seq_capacity
        if 2 * _align(need) <= seq:
            seq = _align(need)
        if (rows, seq) == (self.row_capacity, self.seq_capacity):
            return False
        self._reallocate(rows, seq)
        self.shrink_count += 1
        return True

    def _reallocate(self, rows: int, seq: int) -> None:
        shape = (self.num_layers, rows, self.kv_heads, seq, self.head_dim)
        keys = torch.zeros(shape, dtype=self.dtype, device=self.device)
        values = torch.zeros(shape, dtype=self.dtype, device=self.device)
        n, s = self.rows, min(seq, self.seq_capacity)
        if n:
            keys[:, :n, :, :s].copy_(self.keys[:, :n, :, :s])
            values[:, :n, :, :s].copy_(self.values[:, :n, :, :s])
        self.keys, self.values = keys, values

    def append(self, layer_keys: list[torch.Tensor], layer_values: list[torch.Tensor], length: int, seq_needed: int) -> int:
        """Copy one sequence's prompt KV (per layer ``[kv_heads, length, head_dim]``) into a new row."""
        if len(layer_keys) != self.num_layers or len(layer_values) != self.num_layers:
            raise ValueError(f"KV has {len(layer_keys)} layers, the model has {self.num_layers}")
        self.reserve(*self.planned_capacity(1, seq_needed))
        row = self.rows
        for layer, (k, v) in enumerate(zip(layer_keys, layer_values)):
            self.keys[layer, row, :, :length].copy_(k)
            self.values[layer, row, :, :length].copy_(v)
        self.lengths.append(length)
        self.needs.append(seq_needed)
        return row

    def remove(self, row: int) -> int | None:
        """Free ``row``; the last row moves into it. Returns the old index of the moved row."""
        last = self.rows - 1
        moved = None
        if row != last:
            n = self.lengths[last]
            self.keys[:, row, :, :n].copy_(self.keys[:, last, :, :n])
            self.values[:, row, :, :n].copy_(self.values[:, last, :, :n])
            self.lengths[row], self.needs[row] = n, self.needs[last]
            moved = last
        self.lengths.pop()
        self.needs.pop()
        return moved

    def step_cache(self) -> StepCache:
        """The Cache adapter for one decode step over every row (each writes at its length)."""
        return StepCache(self)

    def advance(self) -> None:
        self.lengths = [n + 1 for n in self.lengths]


class StepCache(Cache):
    """One decode step's view of a ``SlotKV`` as a transformers ``Cache`` (query length 1)."""

    def __init__(self, slots: SlotKV) -> None:
        super().__init__(layers=[])
        self.slots = slots
        n = slots.rows
        self.positions = torch.tensor(slots.lengths, dtype=torch.long, device=slots.device)
        heads = torch.arange(slots.kv_heads, device=slots.device)
        rows = torch.arange(n, device=slots.device)
        # position of (row, head, token) in the layer buffer viewed as [rows * heads * seq, head_dim]
        self.flat_index = ((rows[:, None] * slots.kv_heads + heads[None, :]) * slots.seq_capacity + self.positions[:, None]).reshape(-1)
        self.kv_len = max(slots.lengths) + 1
        self.uniform = min(slots.lengths) == max(slots.lengths)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        s, n, dim = self.slots, self.slots.rows, self.slots.head_dim
        # index_copy_ along a flat (row, head, position) axis: ~10 us; advanced-index assignment
        # (keys[rows, :, positions] = ...) takes milliseconds on CPU
        s.keys[layer_idx].view(-1, dim).index_copy_(0, self.flat_index, key_states.reshape(-1, dim))
        s.values[layer_idx].view(-1, dim).index_copy_(0, self.flat_index, value_states.reshape(-1, dim))
        return s.keys[layer_idx, :n, :, : self.kv_len], s.values[layer_idx, :n, :, : self.kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv_len - 1

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.kv_len, 0

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.kv_len - 1

    def attention_mask(self) -> torch.Tensor | None:
        """None when every row has the same length (the kernel generate() uses), else a 4D bool mask."""
        if self.uniform:
            return None
        cols = torch.arange(self.kv_len, device=self.slots.device)
        return (cols[None, :] <= self.positions[:, None])[:, None, None, :]


def _align(n: int) -> int:
    return -(-n // SEQ_ALIGN) * SEQ_ALIGN
