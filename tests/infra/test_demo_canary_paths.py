"""The demo waits for a canary round on every path its pools form: its count of those paths
must be the drift monitor's (``paths_of``), or it would stop waiting early or always time out."""

from __future__ import annotations

import pytest

from phaseroute.consumers.drift_monitor import paths_of
from phaseroute.demo.run import canary_paths
from phaseroute.infra.pool_spec import PoolSpec
from phaseroute.infra.stack import demo_pools
from phaseroute.streams.policy import Phase, PoolState

PHASES = {"prefill": frozenset({Phase.PREFILL}), "decode": frozenset({Phase.DECODE}),
          "both": frozenset({Phase.PREFILL, Phase.DECODE})}


def _alive(spec: PoolSpec) -> PoolState:
    return PoolState(spec.name, True, PHASES[spec.phase], frozenset({"m"}), spec.variant, 1, 16, 1e9)


@pytest.mark.parametrize("pools", [
    demo_pools(2),
    [PoolSpec("a", "both"), PoolSpec("b", "both")],
    [PoolSpec("p", "prefill"), PoolSpec("d", "decode")],
    [PoolSpec("p", "prefill")],
], ids=["demo", "two-colocated", "one-pair", "prefill-only"])
def test_the_demo_counts_the_paths_the_drift_monitor_measures(pools: list[PoolSpec]) -> None:
    assert canary_paths(pools) == len(paths_of([_alive(p) for p in pools], ["m"]))


def test_the_demos_pools_form_four_paths() -> None:
    assert canary_paths(demo_pools(2)) == 4  # colo; colo -> decode; prefill -> decode; prefill -> colo
