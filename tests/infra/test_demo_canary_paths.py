"""The demo waits for a canary round on every path its pools form, counted by the drift
monitor's own ``paths_of``: the count must be right, or the wait stops early or always runs out."""

from __future__ import annotations

import pytest

from phaseroute.demo.run import canary_paths
from phaseroute.infra.pool_spec import PoolSpec
from phaseroute.infra.stack import demo_pools


@pytest.mark.parametrize(("pools", "paths"), [
    (demo_pools(2), 4),                                           # colo; colo -> decode; prefill -> decode; prefill -> colo
    ([PoolSpec("a", "both"), PoolSpec("b", "both")], 4),          # a; b; a -> b; b -> a
    ([PoolSpec("p", "prefill"), PoolSpec("d", "decode")], 1),
    ([PoolSpec("p", "prefill")], 0),
], ids=["demo", "two-colocated", "one-pair", "prefill-only"])
def test_the_demo_counts_the_paths_its_pools_form(pools: list[PoolSpec], paths: int) -> None:
    assert canary_paths(pools) == paths
