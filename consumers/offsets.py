"""Which offsets a worker may commit when work finishes out of order.

A decode worker finishes requests in any order (each has its own length), so offset N of a
partition may be committed only when every message at or below N is finished and its
outputs are durably produced. ``OffsetTracker`` keeps, per partition, the offsets taken and
not yet finished; the committable position is the lowest unfinished offset (or one past the
highest finished one when nothing is pending). A crash loses nothing: whatever was not
committed is consumed again, and the sinks drop the duplicates by id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TopicPartition = tuple[str, int]


@dataclass
class _PartitionState:
    pending: set[int] = field(default_factory=set)
    high_done: int = -1  # highest offset finished so far
    committed: int = -1  # next offset to read, as last committed (-1: never)


class OffsetTracker:
    """Per-partition bookkeeping of taken, finished and committed offsets."""

    def __init__(self) -> None:
        self._parts: dict[TopicPartition, _PartitionState] = {}

    def taken(self, tp: TopicPartition, offset: int) -> None:
        """A message was handed to the worker."""
        self._parts.setdefault(tp, _PartitionState()).pending.add(offset)

    def holds(self, tp: TopicPartition, offset: int) -> bool:
        """Whether ``offset`` of ``tp`` was taken and is not finished yet."""
        state = self._parts.get(tp)
        return state is not None and offset in state.pending

    def done(self, tp: TopicPartition, offset: int) -> None:
        """The message's outputs are durably produced (or it went to the dead-letter topic)."""
        state = self._parts.get(tp)
        if state is None or offset not in state.pending:
            raise KeyError(f"offset {offset} of {tp[0]}[{tp[1]}] was never taken or is already done")
        state.pending.discard(offset)
        state.high_done = max(state.high_done, offset)

    def committable(self) -> dict[TopicPartition, int]:
        """Positions (next offset to read) that advanced since the last ``committed`` call."""
        positions = {}
        for tp, state in self._parts.items():
            position = min(state.pending) if state.pending else state.high_done + 1
            if position > state.committed and position > 0:
                positions[tp] = position
        return positions

    def committed(self, positions: dict[TopicPartition, int]) -> None:
        for tp, position in positions.items():
            self._parts[tp].committed = position

    def forget(self, tps: list[TopicPartition]) -> None:
        """Partitions revoked in a rebalance: their unfinished work is handed back."""
        for tp in tps:
            self._parts.pop(tp, None)

    def pending_count(self) -> int:
        return sum(len(s.pending) for s in self._parts.values())
