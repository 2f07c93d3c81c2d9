"""FairScheduler: VTC bound under a 20x imbalance, weights, caps, units, urgency, backpressure."""

from __future__ import annotations

import pytest

from phaseroute.streams.policy import FairConfig, FairScheduler, FreeCapacity, RequestWork

COST = 500 + 2 * 100  # one request: 500 prompt + 2 x 100 output tokens


def work(
    tenant: str, n: int, *, job: str | None = None, deadline: float | None = None, prompt: int = 500, out: int = 100
):
    job = job or f"{tenant}-job"
    return [RequestWork(f"{job}/{i}", job, tenant, "m", prompt, out, deadline) for i in range(n)]


def fill(s: FairScheduler, requests, now=0.0):
    for r in requests:
        s.enqueue(r, now)


def drive(s: FairScheduler, steps: int, per_step: int, watch=lambda s, out: None, now0: float = 0.0):
    """Release ``per_step`` requests per step and finish them at once (actual output = max)."""
    served = {}
    for k in range(steps):
        out = s.schedule(FreeCapacity(per_step), now0 + k)
        for rel in out.releases:
            served[rel.request.tenant] = served.get(rel.request.tenant, 0) + rel.cost
            s.on_finished(rel.request.request_id, now0 + k, rel.request.max_output_tokens)
        watch(s, out)
    return served


def backlogged(s: FairScheduler) -> set[str]:
    return {r.tenant for r in s.report() if r.queued_requests > 0}


@pytest.mark.parametrize(("weights", "ratio"), [({}, 1.0), ({"A": 2.0}, 2.0)])
def test_a_small_tenant_keeps_its_weighted_share_against_a_20x_flood(weights, ratio):
    config = FairConfig(tenant_weights=weights, max_unit_cost=4 * COST, urgency_bound=0.0)
    s = FairScheduler(config)
    fill(s, work("A", 2000))  # 20x B's tokens
    fill(s, work("B", 100))
    bound = s.fairness_bound()
    assert bound == pytest.approx(4 * COST / min(1.0, *weights.values()) if weights else 4 * COST)
    gaps, served = [], {}

    def watch(s: FairScheduler, out) -> None:
        if backlogged(s) == {"A", "B"}:
            c = s.counters()
            gaps.append(abs(c["A"] - c["B"]))
            served.update({r.tenant: r.served_cost for r in s.report()})

    drive(s, 60, 8, watch)
    assert len(gaps) >= 10 and max(gaps) <= bound  # the VTC bound, numerically, at every step both were backlogged
    # In weighted service: served_A / w_A and served_B / w_B differ by at most the bound.
    assert abs(served["A"] / ratio - served["B"]) <= bound
    assert served["B"] == pytest.approx((served["A"] + served["B"]) / (1 + ratio), abs=bound)


def test_the_flood_is_served_alone_once_the_small_tenant_is_done():
    s = FairScheduler(FairConfig(urgency_bound=0.0))
    fill(s, work("A", 400))
    fill(s, work("B", 10))
    served = drive(s, 20, 10)
    assert served["B"] == 10 * COST and served["A"] == 190 * COST  # work-conserving


def test_late_arrival_is_lifted_to_the_minimum_counter_and_gets_no_burst():
    config = FairConfig(max_unit_cost=2 * COST, urgency_bound=0.0)
    s = FairScheduler(config)
    fill(s, work("A", 1000))
    fill(s, work("B", 1000))
    drive(s, 20, 10)
    low = min(s.counters().values())
    fill(s, work("C", 500), now=20.0)
    assert s.counters()["C"] == pytest.approx(low)
    served = drive(s, 30, 9, now0=21.0)
    assert max(served.values()) - min(served.values()) <= 2 * s.fairness_bound()  # ~even thirds, no catch-up burst


def test_in_flight_cap_and_bounded_units():
    config = FairConfig(max_unit_requests=3, max_unit_cost=2 * COST, default_max_in_flight=5)
    s = FairScheduler(config)
    fill(s, work("A", 50))
    out = s.schedule(FreeCapacity(100), 0.0)
    assert len(out.releases) == 5  # the in-flight cap, though 100 were free
    units = {}
    for rel in out.releases:
        units.setdefault(rel.unit, []).append(rel.cost)
    assert all(len(u) <= 3 and sum(u) <= 2 * COST for u in units.values())
    assert "in-flight cap" in out.stop_reason
    assert s.schedule(FreeCapacity(100), 1.0).releases == ()
    s.on_finished(out.releases[0].request.request_id, 2.0)
    assert len(s.schedule(FreeCapacity(100), 2.0).releases) == 1


def test_a_request_larger_than_a_unit_goes_alone():
    s = FairScheduler(FairConfig(max_unit_cost=1000.0))
    fill(s, work("A", 3, prompt=5000))
    out = s.schedule(FreeCapacity(10), 0.0)
    assert [r.unit for r in out.releases] == [0, 1, 2]


def test_backpressure_releases_only_what_is_free():
    s = FairScheduler()
    fill(s, work("A", 50))
    assert len(s.schedule(FreeCapacity(3), 0.0).releases) == 3
    out = s.schedule(FreeCapacity(100, cost=2.5 * COST), 0.0)
    assert len(out.releases) == 2
    assert "costs 700 > free cost 350" in out.stop_reason
    assert s.schedule(FreeCapacity(0), 0.0).releases == ()


def test_urgency_serves_a_late_tenant_ahead_but_only_within_the_bound():
    u = 10 * COST
    config = FairConfig(max_unit_cost=COST, max_unit_requests=1, urgency_bound=u, urgency_slack_s=100.0)
    s = FairScheduler(config)
    fill(s, work("A", 500))
    fill(s, work("B", 500, deadline=50.0))  # slack 50 s < 100 s: urgent from the start
    gaps, urgent = [], 0

    def watch(s: FairScheduler, out) -> None:
        nonlocal urgent
        c = s.counters()
        gaps.append(c["B"] - c["A"])
        urgent += sum(r.urgent for r in out.releases)

    drive(s, 40, 4, watch)
    assert urgent > 0
    assert max(gaps) <= u + COST  # never more than U (+ one unit) ahead of its VTC share
    assert max(gaps) >= u  # and it did use the override up to the bound


def test_slack_uses_the_jobs_remaining_work_at_fleet_throughput():
    config = FairConfig(max_unit_cost=COST, max_unit_requests=1, urgency_bound=1e9, urgency_slack_s=10.0)
    s = FairScheduler(config)
    fill(s, work("A", 10))
    fill(s, work("B", 10, deadline=1000.0))
    # Deadline far away: no urgency, plain VTC (A first by name at equal counters, then B).
    assert [r.request.tenant for r in s.schedule(FreeCapacity(2), 0.0).releases] == ["A", "B"]
    # 9 x 700 cost units left at 7 units/s = 900 s of work: slack 1000 - 1 - 900 < 10 s -> urgent.
    rel = s.schedule(FreeCapacity(1), 91.0, fleet_cost_per_s=7.0).releases[0]
    assert rel.request.tenant == "B" and rel.urgent


def test_finish_corrects_the_charge_and_is_idempotent():
    s = FairScheduler()
    fill(s, work("A", 1))
    rel = s.schedule(FreeCapacity(1), 0.0).releases[0]
    assert s.counters()["A"] == COST
    assert s.on_finished(rel.request.request_id, 1.0, output_tokens=40)
    assert s.counters()["A"] == 500 + 2 * 40
    assert not s.on_finished(rel.request.request_id, 1.0, output_tokens=40)
    assert s.report()[0].in_flight == 0


def test_cancel_job_drops_its_queued_requests():
    s = FairScheduler()
    fill(s, work("A", 5, job="x") + work("A", 2, job="y"))
    removed = s.cancel_job("x")
    assert len(removed) == 5
    (rep,) = s.report()
    assert rep.queued_requests == 2 and rep.queued_cost == 2 * COST


def test_report_exposes_counters():
    s = FairScheduler(FairConfig(tenant_weights={"A": 2.0}, tenant_max_in_flight={"A": 7}))
    fill(s, work("A", 2) + work("B", 1))
    s.schedule(FreeCapacity(2), 0.0)
    rep = {r.tenant: r for r in s.report()}
    assert rep["A"].weight == 2.0 and rep["A"].max_in_flight == 7
    assert s.counters() == {"A": rep["A"].counter, "B": rep["B"].counter}


def test_a_request_enqueued_again_gives_back_its_in_flight_slot():
    """A retry or a request of a lost pool comes back to the queue while still counted as
    running: its slot is freed first (it used to leak one slot per retry), its charge is kept."""
    s = FairScheduler(FairConfig(default_max_in_flight=2))
    fill(s, work("A", 2))
    first = s.schedule(FreeCapacity(2), 0.0).releases
    assert s.report()[0].in_flight == 2
    s.enqueue(first[0].request, 1.0)  # retried
    (rep,) = s.report()
    assert rep.in_flight == 1 and rep.counter == 2 * COST, "the failed attempt's service stays charged"
    again = s.schedule(FreeCapacity(2), 2.0).releases
    assert [r.request.request_id for r in again] == [first[0].request.request_id]
    assert s.report()[0].in_flight == 2
    for r in (again[0], first[1]):
        assert s.on_finished(r.request.request_id, 3.0, 100)
    assert s.report()[0].in_flight == 0


def test_state_restored_after_a_restart_keeps_counters_and_running_slots():
    """After a restart the flood keeps its counter and served cost (no fresh start), its three
    running requests hold their slots again (no second set of slots), and their finish still
    corrects the charge."""
    before = FairScheduler(FairConfig(default_max_in_flight=4))
    fill(before, work("flood", 40))
    drive(before, 10, 1)  # only the flood is backlogged: it is served alone
    running = before.schedule(FreeCapacity(3), 10.0).releases
    saved = before.state()
    assert saved["flood"] == (13 * COST, 13 * COST)

    after = FairScheduler(FairConfig(default_max_in_flight=4))
    after.restore(saved)
    for r in running:
        after.resume(r.request)
    fill(after, [r for r in work("flood", 40)[13:]] + work("small", 5), now=11.0)
    rep = {r.tenant: r for r in after.report()}
    assert rep["flood"].in_flight == 3 and rep["flood"].counter == 13 * COST
    assert rep["small"].counter == 13 * COST, "a newcomer is lifted to the minimum backlogged counter, no lower"
    out = after.schedule(FreeCapacity(3), 12.0).releases
    assert [r.request.tenant for r in out].count("flood") <= 1, "the flood has 1 slot left of 4"
    charged = after.counters()["flood"]
    assert after.on_finished(running[0].request.request_id, 13.0, 50)
    assert after.counters()["flood"] == charged - 2 * (100 - 50)


def test_restore_rejects_a_counter_that_is_not_finite():
    with pytest.raises(ValueError, match="tenant 'A': saved counter nan"):
        FairScheduler().restore({"A": (float("nan"), 0.0)})
