"""Paged KV cache for continuous batching: one preallocated pool of fixed-size blocks.

Every layer's keys and values live in two tensors shaped
``[layers, num_blocks, kv_heads, block_size, head_dim]``, allocated once per decode session
(``torch.empty``: pages are only backed by memory once written, and blocks are handed out
lowest first, so the resident part is the pool's used prefix). Sequences of any length share
the pool through their block tables (``kv_blocks.BlockAllocator``), so KV memory is the tokens
stored rounded up to a block per sequence, not a rectangle of rows x the longest sequence.

Life of a sequence's KV here: ``join`` takes blocks for its prompt (and reserves what
``max_tokens`` may add) and copies the prompt KV into them; every decode step ``step_cache``
gives each row one slot (a new block when it crosses a block boundary), the model writes
the step's key/value there in place (``PagedStep.update``), and attention reads the used
blocks ``[:high_water]`` as a view with, per block, its owning row and how many tokens it
holds (``attention.paged_decode_attention``): no copy of the cache. A batch of one row is the
exception: its blocks are gathered into one contiguous ``[1, kv_heads, tokens, head_dim]``
tensor and attention takes transformers' own SDPA path, so a lone sequence's logits are
bit-identical to ``generate()`` (the copy is one sequence's KV, small next to the step). ``leave`` gives the
blocks back, zeroed; rows stay dense (the last row takes the leaving one's index, only its
block owners are rewritten). The next ``step_cache`` compacts the pool first: the highest used
blocks are copied into the holes the leavers left (a copy of the moved blocks, once), so
attention never reads a free block. Attention reads every used block whole and masks what is not
valid, but a masked value still meets a zero weight (0 x NaN is NaN), so a block must never
hold non-finite leftovers (a corrupted KV that left): blocks are zeroed when given back, and
on first use (``torch.empty`` memory is arbitrary).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache

from phaseroute.engine.kv_blocks import BlockAllocator

DEFAULT_BLOCK_SIZE = 16  # tokens per block (vLLM's default); waste <= block_size - 1 tokens per sequence


class PagedKV:
    """The block pool's tensors, the rows in flight and their lengths; see the module docstring."""

    def __init__(
        self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: str,
        num_blocks: int, block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> None:
        self.num_layers, self.kv_heads, self.head_dim = num_layers, kv_heads, head_dim
        self.dtype, self.device, self.block_size = dtype, torch.device(device), block_size
        self.blocks = BlockAllocator(num_blocks, block_size)
        shape = (num_layers, num_blocks, kv_heads, block_size, head_dim)
        self.keys = torch.empty(shape, dtype=dtype, device=self.device)
        self.values = torch.empty(shape, dtype=dtype, device=self.device)
        self.owner = torch.zeros(num_blocks, dtype=torch.long, device=self.device)  # row holding each block
        self.fill = torch.zeros(num_blocks, dtype=torch.long, device=self.device)  # tokens stored in each block
        self.clean_upto = 0  # blocks below were zeroed once (blocks are first taken lowest first)
        self.row_ids: list[str] = []  # sequence id per row (row == index in the decode batch)
        self.lengths: list[int] = []  # tokens stored per row

    # ---- sizes --------------------------------------------------------------------
    @property
    def rows(self) -> int:
        return len(self.row_ids)

    def block_bytes(self) -> int:
        return self.num_layers * 2 * self.kv_heads * self.block_size * self.head_dim * self.keys.element_size()

    def capacity_bytes(self) -> int:
        """The whole pool."""
        return self.blocks.num_blocks * self.block_bytes()

    def allocated_bytes(self) -> int:
        """Blocks holding tokens now."""
        return self.blocks.taken * self.block_bytes()

    def free_bytes(self) -> int:
        """Blocks a new sequence can get (neither taken nor reserved by a running one)."""
        return self.blocks.free_blocks * self.block_bytes()

    def live_tokens(self) -> int:
        return sum(self.lengths)

    def can_join(self, total_tokens: int) -> bool:
        return self.blocks.can_admit(total_tokens)

    # ---- join and leave -----------------------------------------------------------
    def join(self, seq_id: str, layer_keys: list[torch.Tensor], layer_values: list[torch.Tensor], length: int, total_tokens: int) -> int:
        """Copy one sequence's prompt KV (per layer ``[kv_heads, length, head_dim]``) into new blocks; its row."""
        if len(layer_keys) != self.num_layers or len(layer_values) != self.num_layers:
            raise ValueError(f"KV has {len(layer_keys)} layers, the model has {self.num_layers}")
        blocks = self.blocks.admit(seq_id, length, total_tokens)
        self._first_use(max(blocks, default=-1))
        row = self.rows
        index = torch.tensor(blocks, dtype=torch.long, device=self.device)
        full, rest = divmod(length, self.block_size)
        for layer in range(self.num_layers):
            for pool, kv in ((self.keys, layer_keys[layer]), (self.values, layer_values[layer])):
                if full:
                    part = kv[:, : full * self.block_size].reshape(self.kv_heads, full, self.block_size, self.head_dim)
                    pool[layer].index_copy_(0, index[:full], part.transpose(0, 1).to(self.device, self.dtype))
                if rest:
                    pool[layer, blocks[full], :, :rest].copy_(kv[:, full * self.block_size :])
        self.owner[index] = row
        self.fill[index] = self.block_size
        if rest:
            self.fill[blocks[full]] = rest
        self.row_ids.append(seq_id)
        self.lengths.append(length)
        return row

    def leave(self, row: int) -> int | None:
        """Free ``row``'s blocks; the last row takes index ``row``. Returns the moved row's old index."""
        freed = torch.tensor(self.blocks.release(self.row_ids[row]), dtype=torch.long, device=self.device)
        self.owner[freed] = 0
        self.fill[freed] = 0
        self.keys.index_fill_(1, freed, 0.0)
        self.values.index_fill_(1, freed, 0.0)
        last, moved = self.rows - 1, None
        if row != last:
            moved_blocks = self.blocks.tables[self.row_ids[last]].blocks
            self.owner[torch.tensor(moved_blocks, dtype=torch.long, device=self.device)] = row
            self.row_ids[row], self.lengths[row] = self.row_ids[last], self.lengths[last]
            moved = last
        self.row_ids.pop()
        self.lengths.pop()
        return moved

    # ---- one decode step ------------------------------------------------------------
    def compact(self) -> int:
        """Copy the used blocks above the used count into the free ones below; blocks moved."""
        moves = self.blocks.compact()
        if not moves:
            return 0
        src = torch.tensor([m[0] for m in moves], dtype=torch.long, device=self.device)
        dst = torch.tensor([m[1] for m in moves], dtype=torch.long, device=self.device)
        for pool in (self.keys, self.values):
            pool.index_copy_(1, dst, pool.index_select(1, src))
            pool.index_fill_(1, src, 0.0)  # free blocks hold zeros (see the module docstring)
        for column in (self.owner, self.fill):
            column[dst] = column[src]
            column[src] = 0
        return len(moves)

    def step_cache(self) -> PagedStep:
        """Compact the pool, give every row the slot of its next token (a new block at a boundary);
        the step's Cache."""
        self.compact()
        bs, slots, last_blocks = self.block_size, [], []
        for row, (seq_id, n) in enumerate(zip(self.row_ids, self.lengths)):
            table = self.blocks.tables[seq_id].blocks
            if n // bs == len(table):  # the row's blocks are full: take one from its reservation
                block = self.blocks.grow(seq_id)
                self._first_use(block)
                self.owner[block] = row
            block = table[n // bs]
            last_blocks.append(block)
            slots.append(block * bs + n % bs)
        index = torch.tensor(last_blocks, dtype=torch.long, device=self.device)
        self.fill.index_add_(0, index, torch.ones_like(index))
        return PagedStep(self, torch.tensor(slots, dtype=torch.long, device=self.device))

    def advance(self) -> None:
        self.lengths = [n + 1 for n in self.lengths]

    def _first_use(self, block: int) -> None:
        """Zero the blocks up to ``block`` that were never used (the ever-used blocks are a prefix)."""
        if block >= self.clean_upto:
            self.keys[:, self.clean_upto : block + 1].zero_()
            self.values[:, self.clean_upto : block + 1].zero_()
            self.clean_upto = block + 1


class PagedStep(Cache):
    """One decode step's view of a ``PagedKV`` as a transformers ``Cache`` (query length 1).

    ``update`` writes the step's keys/values into each row's slot and returns the pool's used
    blocks; ``valid`` (4D, so transformers passes it through untouched as the attention mask)
    says which token of each used block is valid, ``owner`` which row each used block belongs
    to. With one row (``contiguous``) ``update`` returns that row's KV gathered in token order.
    """

    def __init__(self, kv: PagedKV, slots: torch.Tensor) -> None:
        super().__init__(layers=[])
        self.kv = kv
        self.positions = torch.tensor(kv.lengths, dtype=torch.long, device=kv.device)
        heads = torch.arange(kv.kv_heads, device=kv.device)
        block, offset = slots // kv.block_size, slots % kv.block_size
        # flat index of (block, head, offset) in a layer's pool viewed as [blocks * heads * block_size, head_dim]
        self.flat_index = ((block[:, None] * kv.kv_heads + heads[None, :]) * kv.block_size + offset[:, None]).reshape(-1)
        self.high_water = kv.blocks.high_water
        self.owner = kv.owner[: self.high_water]
        cols = torch.arange(kv.block_size, device=kv.device)
        self.valid = (cols[None, :] < kv.fill[: self.high_water, None])[:, None, None, :]
        self.contiguous = kv.rows == 1
        if self.contiguous:
            self.table = torch.tensor(kv.blocks.tables[kv.row_ids[0]].blocks, dtype=torch.long, device=kv.device)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        kv, dim, hw = self.kv, self.kv.head_dim, self.high_water
        # index_copy_ along a flat (block, head, offset) axis: ~10 us; advanced-index assignment takes ms on CPU
        kv.keys[layer_idx].view(-1, dim).index_copy_(0, self.flat_index, key_states.reshape(-1, dim))
        kv.values[layer_idx].view(-1, dim).index_copy_(0, self.flat_index, value_states.reshape(-1, dim))
        if self.contiguous:
            n = kv.lengths[0] + 1
            return tuple(  # type: ignore[return-value]
                pool[layer_idx].index_select(0, self.table).transpose(0, 1).reshape(kv.kv_heads, -1, dim)[None, :, :n]
                for pool in (kv.keys, kv.values)
            )
        return kv.keys[layer_idx, :hw], kv.values[layer_idx, :hw]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(max(self.kv.lengths))

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return int(max(self.kv.lengths)) + 1, 0

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return int(max(self.kv.lengths))
