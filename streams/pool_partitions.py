"""Which partition of a pool's work topic each dispatched request goes to.

A pool's workers share its topic by partition (a worker owns a contiguous range of them in a
colocated pool, any set in a single-phase one), so the work a partition receives is the work
its worker runs. Hashing the request id spreads a small job unevenly: 48 requests over the six
partitions of ``prefill.colo`` gave one of two workers a third more tokens than the other, which
then stood idle at the end of the job. The dispatcher instead sends each new request to the
partition of that topic that has been given the fewest tokens so far (prompt plus the output it
may ask for), and every later attempt of the request to the same partition, so a replay or a
copy lands on the worker already running it (which skips it, ``phase_handler.py``).

Nothing here reads a clock or does I/O; the memory lives as long as the dispatcher (a new one
starts even, and places a request it has not seen anew: at worst a replay then runs on a second
worker and the result sink keeps one result, as for any copy). ``forget`` drops a finished job's
requests with their prompts.
"""

from __future__ import annotations

from collections.abc import Iterable

from phaseroute.infra.topics import POOL_PARTITIONS


class PoolPartitioner:
    """Least-loaded partition per pool topic, sticky per request."""

    def __init__(self, partitions: int = POOL_PARTITIONS) -> None:
        if partitions < 1:
            raise ValueError(f"a pool topic has at least one partition, got {partitions}")
        self.partitions = partitions
        self._given: dict[str, list[int]] = {}  # topic -> tokens given to each partition
        self._placed: dict[str, dict[str, int]] = {}  # request id -> topic -> its partition

    def place(self, topic: str, request_id: str, tokens: int) -> int:
        """The partition of ``topic`` for ``request_id``: the one it had, else the least given."""
        on_topics = self._placed.setdefault(request_id, {})
        known = on_topics.get(topic)
        if known is not None:
            return known
        given = self._given.setdefault(topic, [0] * self.partitions)
        partition = min(range(self.partitions), key=given.__getitem__)
        given[partition] += max(tokens, 1)
        on_topics[topic] = partition
        return partition

    def forget(self, request_ids: Iterable[str]) -> None:
        """Drop the placements of finished requests (on every topic they went to)."""
        for request_id in request_ids:
            self._placed.pop(request_id, None)

    def placed(self) -> int:
        """How many requests are remembered (live work, not history)."""
        return len(self._placed)
