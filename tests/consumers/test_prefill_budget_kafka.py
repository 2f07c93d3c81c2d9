"""A prefill worker's token budget comes from its pool's newest PREFILL PROFILER row on a real topic
(the TELEMETRY row's curve mixes prompt lengths and is not used for sizing)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer

from phaseroute.consumers.prefill_budget import efficient_batch_size, load_prefill_curve
from phaseroute.schemas import serde
from phaseroute.schemas.enums import ProfileSource
from phaseroute.schemas.examples import example

pytestmark = pytest.mark.kafka


def _row(pool: str, phase: str, updated_at: int, curve: list[tuple[int, float]],
         source: str = "PROFILER") -> dict[str, Any]:
    return dict(example("profile_row"), model="smollm2-135m", pool=pool, phase=phase, variant="fp32",
                source=source, updated_at=updated_at,
                batch_curve=[{"batch_size": b, "tokens_per_s": t} for b, t in curve])


def test_the_newest_prefill_profiler_row_of_the_pool_is_read_and_others_ignored(bootstrap: str, make_topic: Any) -> None:
    topic = make_topic("profiles")
    producer = Producer({"bootstrap.servers": bootstrap})
    for row in (_row("colo", "PREFILL", 2_000, [(1, 400.0), (4, 1600.0)]),
                _row("colo", "PREFILL", 1_000, [(1, 100.0)]),  # older, written later: not the newest
                _row("colo", "DECODE", 3_000, [(1, 20.0), (32, 200.0)]),
                # newer, but live telemetry: its large batches were short prompts, so it falls
                _row("colo", "PREFILL", 4_000, [(1, 450.0), (4, 300.0), (8, 250.0)], source="TELEMETRY"),
                _row("other", "PREFILL", 3_000, [(1, 5.0)])):
        producer.produce(topic, key=row["pool"], value=serde.encode("profile_row", row))
    producer.produce(topic, key="junk", value=b"not avro")  # skipped, never fatal
    assert producer.flush(30) == 0
    curve = load_prefill_curve(bootstrap, topic, "smollm2-135m", "colo", "fp32")
    assert curve == [(1, 400.0), (4, 1600.0)] and efficient_batch_size(curve) == 4
    assert load_prefill_curve(bootstrap, topic, "smollm2-135m", "colo", "fp32", source=ProfileSource.TELEMETRY) \
        == [(1, 450.0), (4, 300.0), (8, 250.0)]
    assert load_prefill_curve(bootstrap, topic, "smollm2-135m", "missing", "fp32") == []
    assert load_prefill_curve(bootstrap, "test.no-such-topic.x", "smollm2-135m", "colo", "fp32", timeout_s=2) == []
