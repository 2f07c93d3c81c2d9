"""The simulator paces the garbage collector for its run and puts the old pace back; results do
not depend on the pace (the collector frees no live object)."""

from __future__ import annotations

import gc
from contextlib import contextmanager

import numpy as np
import pytest

from phaseroute.sim import collector
from phaseroute.sim.engine import SimConfig, Simulator
from phaseroute.sim.runner import make_driver, prepare


def test_the_young_threshold_is_raised_inside_and_restored_after_even_on_error() -> None:
    before = gc.get_threshold()
    with collector.paced_for_long_runs(12_345):
        assert gc.get_threshold() == (12_345, *before[1:])
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError, match="boom"), collector.paced_for_long_runs():
        raise RuntimeError("boom")
    assert gc.get_threshold() == before


def test_a_threshold_that_is_not_positive_is_refused_with_its_value() -> None:
    with pytest.raises(ValueError, match="-1"), collector.paced_for_long_runs(-1):
        pass


def test_a_run_is_paced_and_gives_the_same_result_at_the_default_pace(sim_inputs, monkeypatch) -> None:
    w, f, _ = prepare(sim_inputs.workload(max_requests=1000), sim_inputs.fleet(), load=0.8)
    inside: list[int] = []

    @contextmanager
    def watched():
        with collector.paced_for_long_runs():
            inside.append(gc.get_threshold()[0])
            yield

    monkeypatch.setattr("phaseroute.sim.engine.paced_for_long_runs", watched)
    paced = Simulator(w, f, make_driver("phaseroute"), SimConfig(seed=3)).run()
    assert inside == [collector.YOUNG_THRESHOLD]
    monkeypatch.setattr("phaseroute.sim.engine.paced_for_long_runs", lambda: collector.paced_for_long_runs(700))
    default = Simulator(w, f, make_driver("phaseroute"), SimConfig(seed=3)).run()
    assert paced.counters["events"] > 0
    assert np.array_equal(paced.t_done, default.t_done, equal_nan=True)
    assert paced.job_state == default.job_state and paced.counters == default.counters
