"""Drift detection time against the canary share: the live control core and drift monitor on a
virtual clock, with a fake saturated pool (``phaseroute.sim.drift_detection``)."""

from __future__ import annotations

import math
import statistics

from phaseroute.consumers.drift_monitor import MonitorConfig
from phaseroute.sim.drift_detection import FakePool, detection_table, run_once

LOSSY_AT = 4_000.0  # after the path's wait reached its longest (60 s doubling to 960 s)


def test_a_lossy_path_is_demoted_within_one_longest_wait_and_a_round() -> None:
    monitor = MonitorConfig()
    result = run_once(0.03, LOSSY_AT)
    assert result.detected_after_s is not None
    assert 0 < result.detected_after_s <= monitor.max_interval_s + monitor.round_timeout_s
    # every canary went through the core's fair scheduler: its work stayed within the share
    assert 0 < result.canary_unit_share <= 0.03


def test_a_sound_path_is_never_demoted() -> None:
    result = run_once(0.03, math.inf, horizon_s=3_000.0)
    assert result.detected_after_s is None and result.rounds >= 4


def test_a_larger_share_runs_a_round_faster_on_a_saturated_pool() -> None:
    slow, fast = run_once(0.03, LOSSY_AT), run_once(0.1, LOSSY_AT)
    assert statistics.fmean(fast.round_s) < 0.6 * statistics.fmean(slow.round_s)


def test_the_table_reports_each_share() -> None:
    doc = detection_table((0.03, 0.1), FakePool(), phases=2)
    assert [r["canary_share"] for r in doc["shares"]] == [0.03, 0.1]
    assert all(r["detected"] == r["runs"] == 2 for r in doc["shares"])
    assert doc["pool"]["fake"] is True and len(doc["lossy_at_s"]) == 2
