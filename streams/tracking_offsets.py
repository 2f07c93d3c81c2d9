"""Where the tracking loop may commit each input partition it reads.

Normally after the last record it handled there. But a receipt or a cancel read before its job's
verdict (``jobs.admissions`` is read apart from ``results.written`` and ``jobs.commands``) only
waits in the tracker's memory: were its offset committed and the partition moved before the
verdict came, the partition's next owner would never read it, and a job whose last receipt it
was would never complete. So such a record holds its partition's commit at its own offset until
its job is known, or until the tracker drops it (``early_event_ttl_s``); records after it are
read again by a next owner, which the tracker's idempotent handling allows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from confluent_kafka import TopicPartition

TopicAndPartition = tuple[str, int]


class CommitPositions:
    def __init__(self) -> None:
        self._next: dict[TopicAndPartition, int] = {}  # offset after the last record handled
        self._committed: dict[TopicAndPartition, int] = {}
        self._waiting: dict[TopicAndPartition, dict[int, tuple[str, float]]] = {}  # offset -> (job id, read at)

    def handled(self, topic: str, partition: int, offset: int) -> None:
        self._next[(topic, partition)] = offset + 1

    def waiting(self, topic: str, partition: int, offset: int, job_id: str, now: float) -> None:
        """The record at ``offset`` waits in the tracker for the verdict on ``job_id``."""
        self._waiting.setdefault((topic, partition), {})[offset] = (job_id, now)

    def settle(self, known: Callable[[str], bool], now: float, ttl_s: float) -> None:
        """Let go of the records whose job is now ``known``, or that the tracker dropped by now."""
        for where, held in list(self._waiting.items()):
            for offset in [o for o, (job_id, read_at) in held.items() if known(job_id) or read_at < now - ttl_s]:
                del held[offset]
            if not held:
                del self._waiting[where]

    def waiting_jobs(self, partitions: Iterable[int]) -> set[str]:
        numbers = set(partitions)
        return {job_id for (_, p), held in self._waiting.items() if p in numbers for job_id, _ in held.values()}

    def due(self) -> list[TopicPartition]:
        """The offsets to commit now (only those that moved since the last commit)."""
        out = []
        for where, after_last in sorted(self._next.items()):
            held = self._waiting.get(where)
            position = min(held) if held else after_last
            if self._committed.get(where) != position:
                out.append(TopicPartition(where[0], where[1], position))
        return out

    def committed(self, offsets: Iterable[TopicPartition]) -> None:
        for tp in offsets:
            self._committed[(tp.topic, tp.partition)] = tp.offset

    def forget(self, partitions: Iterable[TopicPartition]) -> None:
        """The partitions left this instance: their next owner reads from what was committed."""
        for tp in partitions:
            where = (tp.topic, tp.partition)
            self._next.pop(where, None)
            self._committed.pop(where, None)
            self._waiting.pop(where, None)
