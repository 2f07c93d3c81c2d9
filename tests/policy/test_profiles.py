"""Profile building from telemetry aggregates, confidence, and the effective (blended) row."""

from __future__ import annotations

import math

import pytest

from phaseroute.streams.policy import (
    ConfidenceConfig,
    LinkAggregate,
    LinkProfile,
    Phase,
    PhaseAggregate,
    ProfileBuilderConfig,
    ProfileSource,
    ProfileTable,
    build_link_profiles,
    build_profile_rows,
    confidence,
    effective_link,
    effective_profile,
)

NOW = 5_000.0


def agg(pool="p", batch=8, samples=100, tps=400.0, errors=0, last_seen=NOW, phase=Phase.DECODE, **kw):
    base = dict(
        model="m",
        phase=phase,
        pool=pool,
        variant="v",
        batch_size=batch,
        samples=samples,
        tokens_per_s=tps,
        step_p50_s=0.01,
        step_p90_s=0.02,
        step_p99_s=0.04,
        errors=errors,
        mem_bytes_per_token=100.0,
        kv_bytes_per_token=50.0,
        last_seen=last_seen,
    )
    base.update(kw)
    return PhaseAggregate(**base)


def test_buckets_become_one_row_with_a_curve():
    rows = build_profile_rows(
        [
            agg(batch=1, samples=50, tps=20.0),
            agg(batch=32, samples=150, tps=200.0, step_p99_s=0.2, errors=3),
            agg(batch=8, samples=100, tps=76.0, last_seen=NOW - 30),
            agg(pool="q", batch=1, tps=5.0),
        ],
        NOW,
    )
    assert [(r.pool, r.phase) for r in rows] == [("p", Phase.DECODE), ("q", Phase.DECODE)]
    p = rows[0]
    assert [(c.batch_size, c.tokens_per_s) for c in p.curve] == [(1, 20.0), (8, 76.0), (32, 200.0)]
    assert p.samples == 300 and p.error_rate == pytest.approx(3 / 300)
    assert p.step_p99_s == 0.2  # the worst bucket's p99: conservative for stragglers
    assert p.updated_at == NOW and p.source is ProfileSource.TELEMETRY
    assert p.quality_score == 1.0  # builder default when canaries never measured it


def test_all_failed_row_keeps_error_rate_and_a_negligible_curve():
    (r,) = build_profile_rows([agg(samples=40, errors=40, tps=0.0)], NOW)
    assert r.error_rate == 1.0
    assert r.tokens_per_s(32) < 1e-3


def test_old_or_thin_buckets_are_dropped():
    cfg = ProfileBuilderConfig(min_bucket_samples=10, max_age_s=600)
    rows = build_profile_rows(
        [agg(batch=1, samples=5, tps=1.0), agg(batch=8), agg(pool="old", last_seen=NOW - 601)], NOW, cfg
    )
    assert [r.pool for r in rows] == ["p"]
    assert [c.batch_size for c in rows[0].curve] == [8]
    assert rows[0].samples == 105  # the thin bucket's samples still count toward the error rate


def test_quality_is_sample_weighted_when_measured():
    (r,) = build_profile_rows(
        [agg(batch=1, samples=10, quality_score=0.9), agg(batch=8, samples=30, quality_score=0.7)], NOW
    )
    assert r.quality_score == pytest.approx(0.75)


def test_link_profiles():
    links = build_link_profiles(
        [LinkAggregate("a", "b", 10, 1e9, 2.0 + 10 * 0.01, NOW, latency_s=0.01), LinkAggregate("a", "c", 0, 0, 0, NOW)],
        NOW,
    )
    assert [(x.src, x.dst, x.latency_s, x.samples) for x in links] == [("a", "b", 0.01, 10)]
    assert links[0].bytes_per_s == pytest.approx(5e8)


@pytest.mark.parametrize(
    ("samples", "age", "half_life", "expected"),
    [
        (0, 0, 600, 0.0),
        (20, 0, 600, 1 - math.exp(-1)),
        (1e9, 600, 600, 0.5),
        (1e9, 1200, 600, 0.25),
        (1e9, -50, 600, 1.0),  # clock skew: a row "from the future" is not boosted
        (1e9, 1e9, math.inf, 1.0),
    ],
)
def test_confidence(samples, age, half_life, expected):
    assert confidence(samples, age, half_life, ConfidenceConfig()) == pytest.approx(expected)


def test_cold_start_profiler_row_is_used_until_telemetry_is_confident(mk):
    profiler = mk.row("p", Phase.DECODE, 1000.0, source=ProfileSource.PROFILER, samples=50, updated_at=0)
    thin = mk.row("p", Phase.DECODE, 100.0, samples=1)  # one slow sample
    rich = mk.row("p", Phase.DECODE, 100.0, samples=500)
    cfg = ConfidenceConfig(min_confidence=0.1)
    only_prior = effective_profile(mk.table(profiler, thin), mk.MODEL, Phase.DECODE, "p", "fp32", mk.NOW, cfg)
    assert only_prior.row.tokens_per_s(32) == 1000.0 and only_prior.telemetry_weight == 0.0
    measured = effective_profile(mk.table(profiler, rich), mk.MODEL, Phase.DECODE, "p", "fp32", mk.NOW, cfg)
    assert measured.row.tokens_per_s(32) == pytest.approx(100.0, rel=1e-6)
    assert measured.row.source is ProfileSource.TELEMETRY


def test_stale_telemetry_decays_toward_the_prior(mk):
    profiler = mk.row("p", Phase.DECODE, 1000.0, source=ProfileSource.PROFILER, updated_at=0)
    tputs = []
    for age in (0, 600, 1800, 6000):
        telemetry = mk.row("p", Phase.DECODE, 250.0, samples=10_000, updated_at=mk.NOW - age)
        eff = effective_profile(
            mk.table(profiler, telemetry), mk.MODEL, Phase.DECODE, "p", "fp32", mk.NOW, ConfidenceConfig()
        )
        tputs.append(eff.row.tokens_per_s(32))
    assert tputs[0] == pytest.approx(250.0)
    assert tputs == sorted(tputs) and tputs[-1] == pytest.approx(1000.0)
    # Half-life 600 s: at one half-life the seconds-per-token are halfway between the two.
    assert 1 / tputs[1] == pytest.approx(0.5 / 250 + 0.5 / 1000)


def test_telemetry_alone_is_used_and_missing_rows_give_none(mk):
    t = mk.table(mk.row("p", Phase.DECODE, 300.0, samples=3))
    eff = effective_profile(t, mk.MODEL, Phase.DECODE, "p", "fp32", mk.NOW, ConfidenceConfig())
    assert eff.row.tokens_per_s(32) == 300.0 and eff.telemetry_weight == 1.0
    assert effective_profile(t, mk.MODEL, Phase.PREFILL, "p", "fp32", mk.NOW, ConfidenceConfig()) is None


def test_effective_link_blends_toward_prior():
    cfg = ConfidenceConfig(link_prior_bytes_per_s=1e9)
    empty = ProfileTable()
    assert effective_link(empty, "a", "b", NOW, cfg).bytes_per_s == 1e9
    measured = empty.with_rows(links=[LinkProfile("a", "b", 1e8, 0.002, 10_000, NOW)])
    assert effective_link(measured, "a", "b", NOW, cfg).bytes_per_s == pytest.approx(1e8)
    stale = empty.with_rows(links=[LinkProfile("a", "b", 1e8, 0.002, 10_000, NOW - 600)])
    assert 1e8 < effective_link(stale, "a", "b", NOW, cfg).bytes_per_s < 1e9


def test_one_table_gives_different_effective_rows_at_different_times(mk):
    profiler = mk.row("p", Phase.DECODE, 1000.0, source=ProfileSource.PROFILER, updated_at=0)
    telemetry = mk.row("p", Phase.DECODE, 250.0, samples=10_000, updated_at=mk.NOW)
    t = mk.table(profiler, telemetry)
    cfg = ConfidenceConfig()
    fresh = effective_profile(t, mk.MODEL, Phase.DECODE, "p", "fp32", mk.NOW, cfg)
    assert effective_profile(t, mk.MODEL, Phase.DECODE, "p", "fp32", mk.NOW, cfg) is fresh  # memoised at this now
    later = effective_profile(t, mk.MODEL, Phase.DECODE, "p", "fp32", mk.NOW + 600, cfg)
    assert later.row.tokens_per_s(32) > fresh.row.tokens_per_s(32)
    assert effective_profile(t, mk.MODEL, Phase.DECODE, "p", "fp32", mk.NOW, cfg) == fresh


def test_a_full_batch_point_the_fresh_batches_contradict_is_dropped():
    """A pool slowed at run time runs smaller batches; its batch-4 point from before the slowdown
    (the CI run's figures: 290 prefill tokens/s, while its fresh batches of 2 ran 61) must not
    stay its full-batch capacity. A stale point the fresh ones do not contradict stays."""
    slowed = build_profile_rows([agg(batch=1, tps=46.8), agg(batch=2, tps=61.4), agg(batch=4, tps=290.4, last_seen=NOW - 40)],
                                NOW)[0]
    assert [p.batch_size for p in slowed.curve] == [1, 2]
    assert slowed.tokens_per_s(4) == pytest.approx(61.4), "read flat above the last fresh point"
    idle = build_profile_rows([agg(batch=1, tps=216.0), agg(batch=4, tps=251.5, last_seen=NOW - 600)], NOW)[0]
    assert [p.batch_size for p in idle.curve] == [1, 4], "a healthy pool that is merely less busy keeps its point"
    small_stale = build_profile_rows([agg(batch=2, tps=27.2, last_seen=NOW - 40), agg(batch=4, tps=8.0)], NOW)[0]
    assert [p.batch_size for p in small_stale.curve] == [4], "faster at batch 2 than the fresh batch 4: dropped"
    recent = build_profile_rows([agg(batch=2, tps=61.4), agg(batch=4, tps=290.4, last_seen=NOW - 20)], NOW)[0]
    assert [p.batch_size for p in recent.curve] == [2, 4], "seen within stale_point_s: not stale yet"
