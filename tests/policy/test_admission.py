"""admit(): each validation reason, quotas, capacity, deadline feasibility with the earliest feasible deadline."""

from __future__ import annotations

import pytest

from phaseroute.schemas import ids
from phaseroute.streams.policy import (
    AdmissionConfig,
    Admitted,
    BacklogJob,
    FleetRate,
    JobSpec,
    ModelSpec,
    Phase,
    QualityTier,
    QueuedWork,
    RejectCode,
    Rejected,
    TenantQuota,
    admit,
    check_deadline,
    earliest_feasible_deadline,
    fleet_rate,
)

NOW = 1000.0
MODELS = {"m": ModelSpec("m", 2048)}
CONFIG = AdmissionConfig(safety_factor=1.0)


def fleet(mk):
    """One pool: prefill 10,000 tokens/s and decode 1,000 tokens/s at full batch (model "m")."""
    pools = [mk.pool("p", models=frozenset({"m"}))]
    profiles = mk.table(mk.row("p", Phase.PREFILL, 10_000.0, model="m"), mk.row("p", Phase.DECODE, 1000.0, model="m"))
    return pools, profiles


def job(**kw) -> JobSpec:
    base = dict(job_id="j1", tenant="t", model="m", prompt_tokens=(1000,) * 10, max_output_tokens=100, deadline=None)
    base.update(kw)
    return JobSpec(**base)


def decide(mk, j, backlog=(), quotas=None, config=CONFIG, models=MODELS):
    pools, profiles = fleet(mk)
    return admit(j, list(backlog), profiles, pools, models, quotas or {}, config, NOW)


# This job is 10 x 1000 prompt tokens (1 s of prefill) + 10 x 100 output tokens (1 s of decode) = 2 s of work.


@pytest.mark.parametrize(
    ("spec", "code", "needle"),
    [
        (dict(job_id=""), RejectCode.MALFORMED, "job_id must be a non-empty string, got ''"),
        (dict(tenant=" "), RejectCode.MALFORMED, "tenant must be a non-empty string, got ' '"),
        (dict(max_output_tokens=0), RejectCode.MALFORMED, "max_output_tokens must be an integer >= 1, got 0"),
        (dict(prompt_tokens=(10, -3)), RejectCode.MALFORMED, "prompt 1 must have an integer token count >= 1, got -3"),
        (dict(prompt_tokens=(10, 2.5)), RejectCode.MALFORMED, "got 2.5"),
        (dict(quality_tolerance=1.5), RejectCode.MALFORMED, "quality_tolerance must be in [0, 1], got 1.5"),
        (dict(deadline=float("nan")), RejectCode.MALFORMED, "deadline must be a finite time, got nan"),
        (
            dict(quality_tier="best"),
            RejectCode.MALFORMED,
            "quality_tier must be one of ['EXACT', 'APPROXIMATE'], got 'best'",
        ),
        (dict(prompt_tokens=()), RejectCode.EMPTY_JOB, "job has no prompts"),
        (dict(model="gpt-9"), RejectCode.UNKNOWN_MODEL, "unknown model 'gpt-9'; known: ['m']"),
        (
            dict(prompt_tokens=(10, 2000), max_output_tokens=100),
            RejectCode.PROMPT_TOO_LONG,
            "request '1' has 2000 prompt tokens + max_tokens 100 > the context limit of 2048 tokens of 'm';"
            " prompts may have at most 1948 tokens",
        ),
        (dict(deadline=NOW), RejectCode.DEADLINE_PASSED, "deadline 1970-01-01T00:16:40+00:00 is not after now (1970-01-01T00:16:40+00:00)"),
        (dict(output_tokens=(5, 5)), RejectCode.MALFORMED, "output_tokens must give one cap per prompt (10), got 2"),
        (dict(output_tokens=(5,) * 9 + (0,)), RejectCode.MALFORMED, "output_tokens[9] must be an integer >= 1, got 0"),
        (
            # the per-prompt cap decides: prompt 1 is short but may generate 1,500 tokens
            dict(prompt_tokens=(1000, 600), output_tokens=(10, 1500), max_output_tokens=1500),
            RejectCode.PROMPT_TOO_LONG,
            "request '1' has 600 prompt tokens + max_tokens 1500 > the context limit of 2048 tokens",
        ),
        (
            # a max_tokens beyond the context names the context limit, not "at most 0 tokens"
            dict(prompt_tokens=(10, 20), max_output_tokens=10**9),
            RejectCode.PROMPT_TOO_LONG,
            "request '1' has 20 prompt tokens + max_tokens 1000000000 > the context limit of 2048 tokens of 'm';"
            " max_tokens must be at most 2028 for this prompt",
        ),
        (dict(job_id="../../etc/evil"), RejectCode.MALFORMED, "may hold only letters, digits and . _ : -"),
        (dict(custom_ids=("a", "a")), RejectCode.MALFORMED, "custom_id 'a' appears twice"),
    ],
)
def test_validation_reasons(mk, spec, code, needle):
    verdict = decide(mk, job(**spec))
    assert isinstance(verdict, Rejected) and verdict.code is code
    assert needle in verdict.reason


def test_admitted_job_is_split_into_requests(mk):
    verdict = decide(mk, job(quality_tier=QualityTier.APPROXIMATE, quality_tolerance=0.1, deadline=NOW + 60))
    assert isinstance(verdict, Admitted)
    assert verdict.work_s == pytest.approx(2.0) and verdict.estimated_completion == pytest.approx(NOW + 2.0)
    assert [r.request_id for r in verdict.requests[:2]] == [ids.request_id("j1", "0"), ids.request_id("j1", "1")]
    r = verdict.requests[0]
    assert (r.tenant, r.prompt_tokens, r.max_output_tokens, r.deadline, r.quality_tolerance) == (
        "t",
        1000,
        100,
        NOW + 60,
        0.1,
    )


def test_per_prompt_output_caps_size_the_work_and_the_requests(mk):
    """Ten prompts capped at 10..100 output tokens (550 in all, not 10 x 100): 1 s of prefill +
    0.55 s of decode, and each request carries its own cap to the router."""
    caps = tuple(range(10, 101, 10))
    verdict = decide(mk, job(output_tokens=caps, deadline=NOW + 60))
    assert isinstance(verdict, Admitted)
    assert verdict.work_s == pytest.approx(1.55)
    assert tuple(r.max_output_tokens for r in verdict.requests) == caps


@pytest.mark.parametrize(
    ("quota", "backlog_jobs", "code", "needle"),
    [
        (
            TenantQuota(max_running_jobs=2),
            2,
            RejectCode.QUOTA_RUNNING_JOBS,
            "tenant 't' has 2 unfinished jobs, quota 2",
        ),
        (
            TenantQuota(max_queued_tokens=25_000),
            2,
            RejectCode.QUOTA_QUEUED_TOKENS,
            "tenant 't' has 22000 tokens queued + 11000 in this job > quota 25000",
        ),
    ],
)
def test_quotas(mk, quota, backlog_jobs, code, needle):
    backlog = [BacklogJob(f"old{i}", "t", "m", None, 10_000, 1000) for i in range(backlog_jobs)]
    verdict = decide(mk, job(), backlog, quotas={"t": quota})
    assert isinstance(verdict, Rejected) and verdict.code is code and needle in verdict.reason
    other = decide(mk, job(tenant="u"), backlog, quotas={"t": quota})  # other tenants are not affected
    assert isinstance(other, Admitted)


def test_default_quota_applies_to_unnamed_tenants(mk):
    config = AdmissionConfig(safety_factor=1.0, default_quota=TenantQuota(max_running_jobs=0))
    assert decide(mk, job(), config=config).code is RejectCode.QUOTA_RUNNING_JOBS


def test_no_capacity_for_a_known_model(mk):
    models = {**MODELS, "big": ModelSpec("big", 8192)}
    verdict = decide(mk, job(model="big"), models=models)
    assert (
        verdict.code is RejectCode.NO_CAPACITY and "no alive, profiled pool serves prefill of 'big'" in verdict.reason
    )


def test_the_named_deadline_is_the_earliest_one_after_the_requested_one(mk):
    # "old" (100 s of work) is already late for NOW + 30, so it constrains nothing; the new job
    # asking for NOW + 50 sorts after it and would finish at NOW + 102.
    backlog = [BacklogJob("old", "u", "m", NOW + 30, 500_000, 50_000)]
    verdict = decide(mk, job(deadline=NOW + 50), backlog)
    assert isinstance(verdict, Rejected) and verdict.code is RejectCode.DEADLINE_INFEASIBLE
    assert "estimated completion 1970-01-01T00:18:22+00:00 (100.0 s of admitted work ahead + 2.0 s" in verdict.reason
    assert verdict.earliest_feasible_deadline == pytest.approx(NOW + 102)
    assert isinstance(decide(mk, job(deadline=NOW + 102), backlog), Admitted)


def test_tight_backlog_pushes_the_job_behind_it_and_names_that_deadline(mk):
    backlog = [BacklogJob("old", "u", "m", NOW + 101, 500_000, 50_000)]  # 100 s of work, 1 s of slack
    verdict = decide(mk, job(deadline=NOW + 50), backlog)
    assert isinstance(verdict, Rejected) and verdict.code is RejectCode.DEADLINE_INFEASIBLE
    # Going first would make "old" late (needs 2 s, it has 1 s of slack): it must go after, done at NOW + 102.
    assert verdict.earliest_feasible_deadline == pytest.approx(NOW + 102)
    assert "on-time job 'old' late" in verdict.reason and "earliest feasible deadline 1970-01-01T00:18:22+00:00" in verdict.reason
    again = decide(mk, job(deadline=verdict.earliest_feasible_deadline), backlog)
    assert isinstance(again, Admitted) and again.estimated_completion == pytest.approx(NOW + 102)


def test_own_work_too_long_for_the_deadline(mk):
    verdict = decide(mk, job(deadline=NOW + 1.5))
    assert verdict.code is RejectCode.DEADLINE_INFEASIBLE
    assert "estimated completion 1970-01-01T00:16:42+00:00" in verdict.reason and verdict.earliest_feasible_deadline == pytest.approx(
        NOW + 2
    )


def test_safety_factor_scales_the_estimate(mk):
    verdict = decide(mk, job(deadline=NOW + 60), config=AdmissionConfig(safety_factor=1.5))
    assert verdict.work_s == pytest.approx(3.0)


def test_best_effort_backlog_does_not_delay_deadline_jobs(mk):
    backlog = [BacklogJob("bulk", "u", "m", None, 5_000_000, 500_000)]  # 1000 s without a deadline
    assert isinstance(decide(mk, job(deadline=NOW + 10), backlog), Admitted)
    no_deadline = decide(mk, job(), backlog)
    assert no_deadline.estimated_completion == pytest.approx(NOW + 1000 + 2)


@pytest.mark.parametrize(
    ("jobs", "work", "deadline", "feasible", "earliest"),
    [
        ([], 5.0, 10.0, True, 5.0),
        ([], 5.0, 4.0, False, 5.0),
        ([QueuedWork("a", 10.0, 8.0)], 5.0, 20.0, True, 13.0),  # after a: 8 + 5
        ([QueuedWork("a", 10.0, 8.0)], 1.0, 3.0, True, 1.0),  # before a: a still done at 9 <= 10
        ([QueuedWork("a", 10.0, 8.0)], 3.0, 3.0, False, 11.0),  # before a breaks it; after: 11
        ([QueuedWork("late", 1.0, 8.0)], 1.0, 5.0, False, 9.0),  # behind the late job: 9 (1.0 would also fit)
        ([QueuedWork("late", 1.0, 8.0)], 0.5, 0.99, True, 0.5),  # an already-late job constrains nothing
        ([QueuedWork("a", 10.0, 2.0), QueuedWork("b", 12.0, 8.0)], 2.0, 5.0, True, 2.0),  # b keeps 2 s of slack
        ([QueuedWork("a", 10.0, 2.0), QueuedWork("b", 12.0, 8.0)], 3.0, 5.0, False, 13.0),  # b would be late
    ],
)
def test_feasibility_table(jobs, work, deadline, feasible, earliest):
    verdict = check_deadline(jobs, work, deadline, now=0.0)
    assert verdict.feasible is feasible
    if not feasible:
        assert verdict.earliest_deadline == pytest.approx(earliest)
        assert earliest == pytest.approx(earliest_feasible_deadline(jobs, work, now=0.0, not_before=deadline))
    else:
        assert earliest_feasible_deadline(jobs, work, now=0.0) == pytest.approx(earliest)
    assert check_deadline(jobs, work, earliest, now=0.0).feasible


def _sized_fleet(mk, capacity: dict[str, float | None], extra=()):
    """Pools p1 (prefill) and p2 (decode) whose workers hold ``capacity`` KV bytes (1,000 B/token),
    plus ``extra`` (pool, row) pairs."""
    pools = [mk.pool("p1", phases=frozenset({Phase.PREFILL}), models=frozenset({"m"}), worker_kv_capacity=capacity["p1"]),
             mk.pool("p2", phases=frozenset({Phase.DECODE}), models=frozenset({"m"}), worker_kv_capacity=capacity["p2"])]
    rows = [mk.row("p1", Phase.PREFILL, 10_000.0, model="m"), mk.row("p2", Phase.DECODE, 1000.0, model="m")]
    pools += [p for p, _ in extra]
    rows += [r for _, r in extra]
    return pools, mk.table(*rows)


def test_a_request_no_worker_can_hold_is_rejected_naming_it_and_the_limit(mk):
    pools, profiles = _sized_fleet(mk, {"p1": 2_000_000.0, "p2": 1_050_000.0})  # 2,000 and 1,050 tokens per worker
    j = job(prompt_tokens=(1000,) * 10, output_tokens=(40,) * 9 + (60,), custom_ids=tuple(f"q{i}" for i in range(10)))
    verdict = admit(j, [], profiles, pools, MODELS, {}, CONFIG, NOW)
    assert isinstance(verdict, Rejected) and verdict.code is RejectCode.REQUEST_TOO_LARGE
    assert verdict.reason == (
        "request 'q9' needs KV for 1060 tokens in decode (prompt 1000 + max_tokens 60) on one worker, but the largest"
        " worker of any alive pool serving decode of 'm' holds 1050 tokens (pool 'p2'); shorten that prompt or lower"
        " its max_tokens")
    fits = job(prompt_tokens=(1000,) * 10, output_tokens=(50,) * 10)
    assert isinstance(admit(fits, [], profiles, pools, MODELS, {}, CONFIG, NOW), Admitted)


def test_a_prompt_too_large_for_every_prefill_worker_is_rejected_in_prefill(mk):
    pools, profiles = _sized_fleet(mk, {"p1": 500_000.0, "p2": 1e9})
    verdict = admit(job(), [], profiles, pools, MODELS, {}, CONFIG, NOW)
    assert verdict.code is RejectCode.REQUEST_TOO_LARGE
    assert "needs KV for 1000 tokens in prefill (its prompt)" in verdict.reason and "holds 500 tokens (pool 'p1')" in verdict.reason


def test_request_size_is_not_judged_when_a_serving_pool_does_not_report_worker_capacity(mk):
    old = mk.pool("p3", phases=frozenset({Phase.PREFILL}), models=frozenset({"m"}))  # an old worker: capacity unknown
    pools, profiles = _sized_fleet(mk, {"p1": 500_000.0, "p2": 1e9}, [(old, mk.row("p3", Phase.PREFILL, 10_000.0, model="m"))])
    assert isinstance(admit(job(), [], profiles, pools, MODELS, {}, CONFIG, NOW), Admitted)


def test_a_dead_pool_does_not_count_as_room_for_a_large_request(mk):
    dead = mk.pool("big", phases=frozenset({Phase.DECODE}), models=frozenset({"m"}), worker_kv_capacity=1e9, alive=False)
    pools, profiles = _sized_fleet(mk, {"p1": 2_000_000.0, "p2": 1_000_000.0}, [(dead, mk.row("big", Phase.DECODE, 1000.0, model="m"))])
    assert admit(job(), [], profiles, pools, MODELS, {}, CONFIG, NOW).code is RejectCode.REQUEST_TOO_LARGE


def test_published_fleet_rates_set_the_seconds_and_a_model_they_give_none_falls_back_to_the_pools(mk):
    pools, profiles = fleet(mk)
    j = job(deadline=NOW + 3.0)  # 2 s of work at the pools' own rates
    assert isinstance(admit(j, [], profiles, pools, MODELS, {}, CONFIG, NOW), Admitted)
    halved = {"m": FleetRate(5_000.0, 500.0)}  # the dispatcher measured half of that: 4 s of work
    verdict = admit(j, [], profiles, pools, MODELS, {}, CONFIG, NOW, published_rates=halved)
    assert isinstance(verdict, Rejected) and verdict.code is RejectCode.DEADLINE_INFEASIBLE
    assert "at 5000 prefill / 500 decode tokens/s" in verdict.reason
    for unknown in ({}, {"m": FleetRate(0.0, 0.0)}, {"m": FleetRate(5_000.0, 0.0)}):
        assert isinstance(admit(j, [], profiles, pools, MODELS, {}, CONFIG, NOW, published_rates=unknown), Admitted)
    assert fleet_rate("m", pools, profiles, NOW, CONFIG.confidence) == FleetRate(10_000.0, 1000.0)
