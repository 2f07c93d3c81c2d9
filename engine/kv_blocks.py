"""Block accounting of the paged KV cache: which fixed-size blocks are free, who holds which.

The KV of every running sequence lives in blocks of ``block_size`` tokens taken from one
preallocated pool (``kv_cache.PagedKV`` owns the tensors; this module only counts). A
sequence's *block table* lists its blocks in token order: token ``p`` is at offset
``p % block_size`` of block ``table[p // block_size]``, as in vLLM's PagedAttention.

Life of a sequence's blocks: ``can_admit(tokens)`` is the side-effect-free predicate;
``admit`` takes the blocks its prompt fills now and *reserves* the rest of what it may reach
(prompt + max_tokens), so a running sequence can always grow and nothing is ever preempted;
``grow`` turns one reserved block into a taken one when the sequence crosses a block
boundary; ``release`` gives every block and the remaining reservation back. Blocks are handed
out lowest index first (a heap), and ``compact`` moves the highest taken blocks into the holes a
released sequence left below them, so the blocks in use are the prefix ``[:taken]`` of the pool
and attention reads exactly them, as a view. Without it a finished long prompt leaves a hole that
every later step reads (the bench's tail read 56% more blocks than it held).

``free_blocks`` (neither taken nor reserved) is what a newcomer can get: the free-KV figure in
heartbeats and the admission check both use it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass
class BlockTable:
    """One sequence's blocks (token order) and the blocks it may still take."""

    blocks: list[int] = field(default_factory=list)
    reserved: int = 0


class BlockAllocator:
    """Free list (lowest first), block tables and reservations of one pool."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"a KV block pool needs num_blocks >= 1 and block_size >= 1, got {num_blocks} and {block_size}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self._free = list(range(num_blocks))  # a heap; sorted is a valid heap
        self._taken: set[int] = set()
        self._holder: dict[int, str] = {}  # taken block -> the sequence whose table lists it
        self.reserved = 0  # blocks promised to running sequences, not yet taken
        self.tables: dict[str, BlockTable] = {}

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def taken(self) -> int:
        return len(self._taken)

    @property
    def free_blocks(self) -> int:
        """Blocks neither taken nor promised: what a new sequence may get."""
        return len(self._free) - self.reserved

    @property
    def high_water(self) -> int:
        """One past the highest taken block (attention reads blocks ``[:high_water]``)."""
        return max(self._taken) + 1 if self._taken else 0

    def can_admit(self, total_tokens: int) -> bool:
        return self.blocks_for(total_tokens) <= self.free_blocks

    def admit(self, seq_id: str, prompt_tokens: int, total_tokens: int) -> list[int]:
        """Take the blocks ``prompt_tokens`` fill, reserve the rest up to ``total_tokens``."""
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id!r} already holds KV blocks")
        need, now = self.blocks_for(total_tokens), self.blocks_for(prompt_tokens)
        if need > self.free_blocks:
            raise MemoryError(
                f"sequence {seq_id!r} needs {need} KV blocks of {self.block_size} tokens ({total_tokens} tokens), "
                f"{self.free_blocks} of {self.num_blocks} are free"
            )
        table = BlockTable([self._take(seq_id) for _ in range(now)], need - now)
        self.reserved += table.reserved
        self.tables[seq_id] = table
        return table.blocks

    def grow(self, seq_id: str) -> int:
        """Take one more block for ``seq_id`` out of its reservation; return its index."""
        table = self.tables[seq_id]
        if table.reserved <= 0:
            raise MemoryError(f"sequence {seq_id!r} has used all {len(table.blocks)} KV blocks it reserved")
        table.reserved -= 1
        self.reserved -= 1
        block = self._take(seq_id)
        table.blocks.append(block)
        return block

    def release(self, seq_id: str) -> list[int]:
        """Give back every block of ``seq_id`` and its remaining reservation; return the blocks."""
        table = self.tables.pop(seq_id)
        self.reserved -= table.reserved
        for block in table.blocks:
            self._taken.discard(block)
            del self._holder[block]
            heapq.heappush(self._free, block)
        return table.blocks

    def compact(self) -> list[tuple[int, int]]:
        """Move every taken block at or above ``taken`` into a free block below it; the moves.

        Afterwards the taken blocks are exactly ``[0, taken)``. Each move is ``(src, dst)``: the
        caller copies block ``src``'s contents to ``dst``; here the tables name ``dst`` in
        ``src``'s place (same position, so token order holds) and ``src`` is free.
        """
        n = len(self._taken)
        if not self._free or self._free[0] >= n:  # the heap's least free block: no hole below n, nothing to move
            return []
        movers = sorted(b for b in self._taken if b >= n)
        if not movers:
            return []
        holes = sorted(b for b in self._free if b < n)  # as many as movers: both count the prefix's gaps
        for src, dst in zip(movers, holes):
            seq_id = self._holder.pop(src)
            blocks = self.tables[seq_id].blocks
            blocks[blocks.index(src)] = dst
            self._holder[dst] = seq_id
        self._taken = set(range(n))
        self._free = [b for b in self._free if b >= n] + movers
        heapq.heapify(self._free)
        return list(zip(movers, holes))

    def _take(self, seq_id: str) -> int:
        block = heapq.heappop(self._free)
        self._taken.add(block)
        self._holder[block] = seq_id
        return block
