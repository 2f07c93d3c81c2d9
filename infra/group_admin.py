"""Admin calls about consumer groups that a just-started broker may not answer yet.

A broker answers group requests with COORDINATOR_LOAD_IN_PROGRESS (or NOT_AVAILABLE) for a
few seconds after it starts, while it loads ``__consumer_offsets``: such a call is asked again
until its timeout instead of failing the command (``phaseroute pools`` right after ``up``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

T = TypeVar("T")
_COORDINATOR_NOT_READY = (KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE,
                          KafkaError.NOT_COORDINATOR)


def while_coordinator_loads(call: Callable[[float], T], timeout_s: float) -> T:
    """``call(time left)``, asked again every 0.5 s while the group coordinator is not ready."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call(max(1.0, deadline - time.monotonic()))
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not isinstance(error, KafkaError) or error.code() not in _COORDINATOR_NOT_READY \
                    or time.monotonic() >= deadline:
                raise
            time.sleep(0.5)


def describe_group(admin: AdminClient, group: str, timeout_s: float) -> Any:
    """The broker's description of ``group`` (members and their assignments)."""
    return while_coordinator_loads(lambda left: admin.describe_consumer_groups([group])[group].result(timeout=left),
                                   timeout_s)
