"""The quality policy (demotion, alerts, hysteresis, recovery) and the router's use of path quality."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from phaseroute.streams.policy import (
    CurvePoint,
    NoPlacement,
    PathQuality,
    Phase,
    PoolState,
    ProfileRow,
    ProfileSource,
    ProfileTable,
    QualityTier,
    RequestWork,
    RouterConfig,
    RouterState,
    route,
)
from phaseroute.streams.policy.quality import (
    PathState,
    QualityAlertKind,
    QualityConfig,
    QualityState,
    exact_failures,
    path_quality,
    step,
)

NOW = 10_000.0
MODEL = "smollm2-135m"
GOOD = dict(positions=120, greedy_agreement=1.0, top1_agreement=1.0, mean_kl=1e-8, max_kl=1e-6)
INT8 = dict(positions=120, greedy_agreement=0.04, top1_agreement=0.62, mean_kl=0.70, max_kl=2.5)
BORDER = dict(positions=120, greedy_agreement=0.95, top1_agreement=0.993, mean_kl=5e-7, max_kl=5e-5)  # passes EXACT, not recovery


@dataclass(frozen=True)
class Figures:
    positions: int
    greedy_agreement: float
    top1_agreement: float
    mean_kl: float
    max_kl: float


def run(states: list[dict], config: QualityConfig = QualityConfig(), start: PathState = PathState()):
    out, state = [], start
    for figures in states:
        verdict = step(state, Figures(**figures), config)
        state = verdict.state
        out.append(verdict)
    return out


def test_thresholds_name_what_failed() -> None:
    assert exact_failures(Figures(**GOOD), QualityConfig()) == []
    failed = exact_failures(Figures(**INT8), QualityConfig())
    assert failed == ["mean KL 0.7 nats > 1e-06 (EXACT)", "max KL 2.5 nats > 0.0001 (EXACT)",
                      "top-1 agreement 0.620 < 0.99 (EXACT)"]
    assert exact_failures(Figures(**{**GOOD, "mean_kl": float("nan")}), QualityConfig())  # NaN never passes
    assert exact_failures(Figures(**BORDER), QualityConfig()) == []
    assert len(exact_failures(Figures(**BORDER), QualityConfig(), recovering=True)) == 3


def test_first_measurement_decides_and_a_failure_demotes_with_an_alert() -> None:
    [ok] = run([GOOD])
    assert ok.state.state is QualityState.HEALTHY and ok.exact_ok and ok.alert is None and ok.reason is None
    [bad] = run([INT8])
    assert bad.state.state is QualityState.DEMOTED and not bad.exact_ok and bad.alert is QualityAlertKind.DEMOTED
    assert "mean KL 0.7 nats" in bad.reason
    [again] = run([INT8], start=bad.state)  # still demoted: no second alert
    assert again.state.state is QualityState.DEMOTED and again.alert is None


def test_demote_after_hysteresis_and_suspect_recovers_silently() -> None:
    config = QualityConfig(demote_after=2)
    v = run([GOOD, INT8, GOOD, INT8, INT8], config)
    assert [x.state.state for x in v] == [QualityState.HEALTHY, QualityState.SUSPECT, QualityState.HEALTHY,
                                         QualityState.SUSPECT, QualityState.DEMOTED]
    assert [x.exact_ok for x in v] == [True, True, True, True, False]
    assert [x.alert for x in v] == [None, None, None, None, QualityAlertKind.DEMOTED]


def test_recovery_needs_consecutive_strict_passes_then_alerts() -> None:
    v = run([INT8, GOOD, GOOD, BORDER, GOOD, GOOD, GOOD], QualityConfig(recover_after=3))
    assert [x.state.state for x in v] == [QualityState.DEMOTED, QualityState.RECOVERING, QualityState.RECOVERING,
                                         QualityState.DEMOTED, QualityState.RECOVERING, QualityState.RECOVERING,
                                         QualityState.HEALTHY]
    assert not any(x.exact_ok for x in v[:-1]) and v[-1].exact_ok  # recovering paths get no EXACT work
    assert [x.alert for x in v] == [QualityAlertKind.DEMOTED, None, None, None, None, None, QualityAlertKind.RECOVERED]
    assert v[1].reason == "recovering: 1 of 3 passing rounds"
    assert "(recovery)" in v[3].reason  # BORDER passes EXACT but not the stricter recovery band


def test_a_round_with_too_few_positions_decides_nothing() -> None:
    [v] = run([{**INT8, "positions": 3}])
    assert not v.decided and v.state == PathState() and v.alert is None and "only 3 positions" in v.reason


def test_recovery_thresholds_must_be_stricter() -> None:
    with pytest.raises(ValueError, match="at least as strict"):
        QualityConfig(recover_max_mean_kl=1.0)


# -- the router -----------------------------------------------------------------------------

def _row(pool: str, phase: Phase, variant: str = "fp32") -> ProfileRow:
    tps = 4000.0 if phase is Phase.PREFILL else 400.0
    if variant != "fp32" and phase is Phase.DECODE:
        tps *= 3  # the lossy pool is the fast one: without quality it wins
    curve = (CurvePoint(1, tps / 8), CurvePoint(8, tps / 2), CurvePoint(32, tps))
    return ProfileRow(MODEL, phase, pool, variant, curve, 0.01, 0.02, 0.03, 2000.0, 1000.0, 0.0, 1.0, 1000, NOW,
                      ProfileSource.TELEMETRY)


def _pool(name: str, phases: frozenset[Phase], variant: str = "fp32") -> PoolState:
    return PoolState(name, True, phases, frozenset({MODEL}), variant, 1, 32, 1e12, last_heartbeat=NOW,
                     kv_format=f"{MODEL}|float32|30x3x64|v1")


PRE, DEC, COLO = frozenset({Phase.PREFILL}), frozenset({Phase.DECODE}), frozenset({Phase.PREFILL, Phase.DECODE})
POOLS = [_pool("pre-fp32", PRE), _pool("dec-int8", DEC, "int8-dynamic"), _pool("colo-fp32", COLO)]
ROWS = [_row("pre-fp32", Phase.PREFILL), _row("dec-int8", Phase.DECODE, "int8-dynamic"),
        _row("colo-fp32", Phase.PREFILL), _row("colo-fp32", Phase.DECODE)]


def _q(src: str, dst: str, score: float, ok: bool) -> PathQuality:
    return PathQuality(MODEL, src, dst, score, ok, 120, NOW)


def _req(tier: QualityTier = QualityTier.EXACT, tolerance: float = 0.0, rid: str = "r") -> RequestWork:
    return RequestWork(rid, "j", "t", MODEL, 64, 64, None, tier, tolerance)


def _decode_pools(table: ProfileTable, request: RequestWork, n: int = 60) -> set[tuple[str, str]]:
    state, rng, out = RouterState(), random.Random(0), set()
    config = RouterConfig(exploration_share=0.3)
    for i in range(n):
        d = route(_req(request.quality_tier, request.quality_tolerance, f"r{i}"), POOLS, table, state, config, NOW, rng)
        assert not isinstance(d, NoPlacement), d.reason
        state.record(d, request, NOW, config)
        out.add((d.prefill_pool, d.decode_pool))
    return out


def test_without_measurements_the_fast_int8_pool_takes_exact_work() -> None:
    assert ("pre-fp32", "dec-int8") in _decode_pools(ProfileTable.from_rows(ROWS), _req())  # the bug this fixes


def test_exact_work_avoids_a_demoted_pool_approximate_work_may_use_it() -> None:
    measured = [_q("pre-fp32", "dec-int8", 0.62, False), _q("colo-fp32", "colo-fp32", 1.0, True),
                _q("pre-fp32", "colo-fp32", 1.0, True)]
    table = ProfileTable.from_rows(ROWS, quality=measured)
    exact = _decode_pools(table, _req())
    assert exact and all(d != "dec-int8" for _, d in exact)
    # colo-fp32 -> dec-int8 was never measured: inferred from the measured path into dec-int8
    inferred = path_quality(table, MODEL, "colo-fp32", "dec-int8", NOW)
    assert inferred is not None and not inferred.exact_ok and inferred.samples == 0
    assert any(d == "dec-int8" for _, d in _decode_pools(table, _req(QualityTier.APPROXIMATE, 0.5)))
    assert all(d != "dec-int8" for _, d in _decode_pools(table, _req(QualityTier.APPROXIMATE, 0.2)))


def test_a_corrupted_link_is_excluded_alone() -> None:
    measured = [_q("pre-fp32", "colo-fp32", 0.10, False), _q("colo-fp32", "colo-fp32", 1.0, True),
                _q("pre-fp32", "dec-int8", 0.62, False), _q("colo-fp32", "dec-int8", 0.62, False)]
    table = ProfileTable.from_rows(ROWS, quality=measured)
    used = _decode_pools(table, _req())
    assert used == {("colo-fp32", "colo-fp32")}
    decision = route(_req(), POOLS, table, RouterState(), RouterConfig(exploration_share=0.0), NOW, random.Random(1))
    assert any(where == "pre-fp32->colo-fp32" and "demoted for exact tier" in why for where, why in decision.rejected)
    # the colocated path through the same decode pool still serves: the link, not the pool, is demoted
    assert path_quality(table, MODEL, "colo-fp32", "colo-fp32", NOW).exact_ok


def test_path_quality_is_none_without_evidence() -> None:
    table = ProfileTable.from_rows(ROWS, quality=[_q("a", "b", 1.0, True)])
    assert path_quality(table, MODEL, "pre-fp32", "colo-fp32", NOW) is None
    assert path_quality(ProfileTable.from_rows(ROWS), MODEL, "a", "b", NOW) is None
