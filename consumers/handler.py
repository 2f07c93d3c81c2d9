"""What a worker's handler receives and returns: plain data between the loop and the engine.

The loop (``consumers.loop``) owns Kafka; a handler owns the work. The loop hands decoded
work items to ``admit``, calls ``step`` while anything is in flight, and produces each
``Completion``'s outputs before it marks the item's offset done. A handler never touches
Kafka, so prefill, decode and colocated workers share one loop and differ only here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from phaseroute.consumers.offsets import TopicPartition


@dataclass(frozen=True)
class WorkItem:
    """One decoded message: where it came from and its Avro record."""

    tp: TopicPartition
    offset: int
    kind: str
    record: dict[str, Any]
    received_at: float  # time.time() when polled (queue-wait accounting)
    produced_at: float  # the Kafka message timestamp (seconds)

    @property
    def ref(self) -> tuple[TopicPartition, int]:
        return (self.tp, self.offset)


@dataclass(frozen=True)
class Output:
    """One message to produce: topic, key, Avro kind and record."""

    topic: str
    key: str
    kind: str
    record: dict[str, Any]


@dataclass
class Completion:
    """A finished work item (or a rejected one) and everything it produces."""

    item: WorkItem
    outputs: list[Output] = field(default_factory=list)
    dead_letter_reason: str | None = None  # set: the item goes to the dead-letter topic instead
    error_class: str | None = None


class Handler(Protocol):
    """The work side of a worker."""

    def capacity(self) -> int:
        """How many more items it can take right now (0: do not poll for work)."""

    def batch_ready(self, waited_s: float) -> bool:
        """True when the gathered items should run now (micro-batch full or waited long enough)."""

    def due_in(self, now: float) -> float:
        """Seconds until ``batch_ready`` turns true by waiting alone (the loop's poll waits that long at most)."""

    def admit(self, items: list[WorkItem]) -> list[Completion]:
        """Take items; return those refused at once (e.g. impossible content) as completions."""

    def step(self) -> list[Completion]:
        """Advance the work in flight (one prefill batch, one decode step); return what finished."""

    def in_flight(self) -> int:
        """Items taken and not yet completed."""

    def drop(self, tps: list[TopicPartition]) -> int:
        """Abandon the in-flight items of revoked partitions (their new owner redoes them)."""

    def telemetry(self) -> list[Output]:
        """Telemetry records accumulated since the last call (one per executed batch)."""

    def status(self) -> dict[str, Any]:
        """Numbers for the heartbeat: batch_in_flight, max_batch, memory_bytes, kv_free_bytes."""
