"""Pool work is spread over a pool topic's partitions by tokens, and every attempt of a request
keeps its partition (so a replay reaches the worker already running it).

The shell test drives ``ControlShell`` through ``plane_fixture.py``, as ``test_control_plane.py`` does: the pool is a fake
described by heartbeats and profile rows; the tokenizer is SmolLM2's real one.
"""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from phaseroute.infra.topics import POOL_PARTITIONS, partition_of
from phaseroute.streams.pool_partitions import PoolPartitioner
from tests.streams.plane_fixture import admit_all, finish, job, plane, prefill


def test_requests_spread_by_tokens_and_each_keeps_its_partition() -> None:
    rng = random.Random(7)
    parts = PoolPartitioner(6)
    sizes = {f"r{i}": rng.randint(40, 600) for i in range(48)}
    first = {rid: parts.place("prefill.colo", rid, tokens) for rid, tokens in sizes.items()}
    given = Counter[int]()
    for rid, partition in first.items():
        given[partition] += sizes[rid]
    assert set(given) == set(range(6))
    assert max(given.values()) - min(given.values()) <= max(sizes.values()), given
    # a replay of every request (any token count) goes where its first attempt went
    assert {rid: parts.place("prefill.colo", rid, 1) for rid in sizes} == first
    # another topic is balanced on its own, and may place the same request elsewhere
    assert parts.place("prefill.other", "r1", 10) == 0
    assert parts.placed() == 48


def test_the_hash_it_replaces_leaves_a_worker_of_two_with_far_more_of_a_small_job() -> None:
    """Why the dispatcher chooses: 48 request ids hashed over 6 partitions, as a colocated pool's
    two workers (partitions 0-2 and 3-5) would share them, against the partitioner's split."""
    rng = random.Random(11)
    ids = [f"{rng.getrandbits(128):032x}" for _ in range(48)]
    hashed = Counter(partition_of(rid, POOL_PARTITIONS) < 3 for rid in ids)
    parts = PoolPartitioner()
    chosen = Counter(parts.place("prefill.colo", rid, 100) < 3 for rid in ids)
    assert chosen[True] == chosen[False] == 24
    assert abs(hashed[True] - hashed[False]) > 0, hashed  # this seed's hash split is uneven


def test_forget_drops_placements_and_a_partition_count_below_one_is_refused() -> None:
    parts = PoolPartitioner(3)
    for rid in ("a", "b", "c"):
        parts.place("prefill.p", rid, 5)
    parts.forget(["a", "b", "zzz"])
    assert parts.placed() == 1
    with pytest.raises(ValueError, match="got 0"):
        PoolPartitioner(0)


def test_the_shell_sends_a_jobs_work_balanced_and_forgets_it_when_the_job_is_done(model_info) -> None:
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    admit_all(cp, job("j-parts", "acme", 24, 3600, now), now)
    t, sent = now, []
    for _ in range(60):  # the pool takes 8 at a time: each round's work finishes before the next
        t += 0.5
        released = prefill(cp.tick(t))
        sent += released
        assert len(sent) == 24 or cp.shell.partitioner.placed() == len(sent)
        for s in released:
            finish(cp, s.record, t)
        if len(sent) == 24:
            break
    assert len(sent) == 24 and all(s.topic == "prefill.colo" for s in sent)
    assert all(s.partition is not None for s in sent)
    per_partition = Counter(s.partition for s in sent)
    assert set(per_partition) == set(range(6)), per_partition
    assert max(per_partition.values()) - min(per_partition.values()) <= 1, per_partition  # near-equal prompts
    for _ in range(5):
        t += 0.5
        cp.tick(t)
    assert cp.job("j-parts")["state"] == "COMPLETED"
    assert cp.shell.partitioner.placed() == 0
