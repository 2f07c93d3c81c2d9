"""The demo summary's tenant shares: whole-run served cost from results, and the fair
scheduler's release shares while every tenant still had work queued."""

from __future__ import annotations

from phaseroute.demo.summary import tenant_shares


def _release(tenant: str, i: int, at_ms: int, attempt: int = 0) -> dict:
    return {"request_id": f"{tenant}/{i}", "job_id": f"job-{tenant}", "tenant": tenant, "prompt_tokens": 10,
            "max_tokens": 5, "dispatched_at": at_ms, "attempt": attempt}


def _result(tenant: str, i: int, done_ms: int) -> dict:
    return {"request_id": f"{tenant}/{i}", "job_id": f"job-{tenant}", "tenant": tenant, "status": "OK",
            "prompt_tokens": 10, "completion_tokens": 5, "completed_at": done_ms}


def test_release_shares_cover_the_time_every_tenant_had_work_queued() -> None:
    # "fast" is released 2 requests per 1 of "slow" (weight 2 vs 1) until its last release at
    # t=4 s; after that only "slow" is left. Its requests also finish first, which a window cut
    # by completions would credit to it alone.
    releases = [_release("fast", i, 1000 * (i // 2)) for i in range(10)]          # 0,0,1,1,...,4,4 s
    releases += [_release("slow", i, 1000 * i) for i in range(12)]                 # 0..11 s
    releases.append(_release("slow", 0, 9000, attempt=1))                          # a retry: counted once
    results = [_result("fast", i, 2000) for i in range(10)] + [_result("slow", i, 20_000) for i in range(12)]
    ids = {"job-fast", "job-slow"}
    rows = {r["tenant"]: r for r in tenant_shares(results, releases, ids, {"fast": 2.0, "slow": 1.0})}
    assert rows["fast"]["share_while_all_backlogged"] == round(10 / 15, 3)  # 10 of the 15 released by t=4 s
    assert rows["slow"]["share_while_all_backlogged"] == round(5 / 15, 3)
    assert rows["fast"]["weighted_share"] == round(2 / 3, 3)
    assert rows["fast"]["served_cost"] == 10 * 20 and rows["slow"]["served_cost"] == 12 * 20
    assert rows["fast"]["share"] == round(200 / 440, 3)


def test_jobs_of_other_runs_are_left_out() -> None:
    releases = [_release("a", 0, 0), dict(_release("b", 0, 0), job_id="someone-else")]
    results = [_result("a", 0, 10)]
    rows = tenant_shares(results, releases, {"job-a"}, {})
    assert [(r["tenant"], r["share_while_all_backlogged"]) for r in rows] == [("a", 1.0)]
