"""The loop polls without waiting only when its handler has work to run now; a handler that is
gathering a batch says when it is due, and the poll waits that long at most (no busy spin)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from phaseroute.consumers.loop import LoopConfig, WorkerLoop


@dataclass
class Gathering:
    """A handler double: ``items`` in flight, ready or not, due in ``due`` seconds."""

    items: int = 0
    ready: bool = False
    due: float = 0.0

    def in_flight(self) -> int:
        return self.items

    def batch_ready(self, now: float) -> bool:
        return self.ready

    def due_in(self, now: float) -> float:
        return self.due


def _loop(handler: Any) -> WorkerLoop:
    # clients are created but never used: nothing here talks to a broker
    return WorkerLoop(LoopConfig("127.0.0.1:1", "g", "c", {"t": "result"}, "test", poll_timeout_s=0.2), handler)


def test_poll_waits_until_the_batch_is_due_and_never_longer_than_the_timeout() -> None:
    assert _loop(Gathering(items=0))._poll_wait_s(0.0) == 0.2  # nothing in flight: wait for messages
    assert _loop(Gathering(items=3, ready=True))._poll_wait_s(0.0) == 0.0  # work to run now
    assert _loop(Gathering(items=3, due=0.05))._poll_wait_s(0.0) == 0.05  # a micro-batch due soon
    assert _loop(Gathering(items=3, due=0.9))._poll_wait_s(0.0) == 0.2  # a sink flush later: capped
