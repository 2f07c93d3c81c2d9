"""Drift metrics (engine.drift) against values computed by hand."""

from __future__ import annotations

import math

import pytest

from phaseroute.engine.drift import LOG_FLOOR, aggregate, bucketed_kl, canary_drift, first_divergence, greedy_matches, top1_matches


def test_token_agreements_and_first_divergence() -> None:
    ref = [5, 6, 7, 8]
    assert greedy_matches(ref, [5, 6, 9, 8]) == 3
    assert first_divergence(ref, [5, 6, 9, 8]) == 2
    assert first_divergence(ref, [5, 6, 7, 8, 2]) == 4  # identical over the reference
    assert first_divergence(ref, [5, 6]) == 2  # stopped early: diverged where it stopped
    assert first_divergence(ref, []) == 0
    assert top1_matches(ref, [5, 0, 7, 0]) == 2


def test_bucketed_kl_by_hand() -> None:
    # reference top-2: p = 0.5, 0.3 (tail 0.2); pool gives those tokens 0.25, 0.25 (tail 0.5)
    ref, pool = [math.log(0.5), math.log(0.3)], [math.log(0.25), math.log(0.25)]
    expected = 0.5 * math.log(0.5 / 0.25) + 0.3 * math.log(0.3 / 0.25) + 0.2 * math.log(0.2 / 0.5)
    assert bucketed_kl(ref, pool) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(0.2180, abs=1e-4)
    assert bucketed_kl(ref, ref) == 0.0


def test_bucketed_kl_is_finite_for_broken_numerics() -> None:
    ref = [math.log(0.9), math.log(0.05)]
    for bad in ([float("nan"), float("nan")], [float("-inf"), -1e9]):
        kl = bucketed_kl(ref, bad)
        assert math.isfinite(kl) and kl == pytest.approx(0.9 * (math.log(0.9) - LOG_FLOOR) + 0.05 * (math.log(0.05) - LOG_FLOOR)
                                                         + 0.05 * math.log(0.05 / 1.0), rel=1e-9)
    with pytest.raises(ValueError, match="2 reference log-probs but 1 pool"):
        bucketed_kl(ref, [0.0])


def test_canary_and_round_aggregate() -> None:
    lp = [math.log(0.6), math.log(0.3)]
    a = canary_drift("a", [1, 2, 3, 4], [lp] * 4, [1, 2, 9, 9], [1, 2, 3, 0], [lp, lp, lp, [math.log(0.3), math.log(0.6)]])
    assert (a.positions, a.greedy_matches, a.top1_matches, a.first_divergence) == (4, 2, 3, 2)
    swapped = 0.6 * math.log(0.6 / 0.3) + 0.3 * math.log(0.3 / 0.6)
    assert a.kl == pytest.approx((0.0, 0.0, 0.0, swapped))
    b = canary_drift("b", [7, 8], [lp] * 2, [7, 8], [7, 8], [lp, lp])
    m = aggregate([a, b])
    assert (m.canaries, m.positions) == (2, 6)
    assert m.greedy_agreement == pytest.approx(4 / 6) and m.top1_agreement == pytest.approx(5 / 6)
    assert m.mean_kl == pytest.approx(swapped / 6) and m.max_kl == pytest.approx(swapped)
    assert (m.first_divergence_mean, m.first_divergence_min) == (2.0, 2)
    with pytest.raises(ValueError):
        aggregate([])
