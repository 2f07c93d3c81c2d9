"""Drift canaries go through the front door: work of the reserved tenant, released by the fair
scheduler within its small share, placed on the exact path it measures (never routed elsewhere,
never copied), forgotten when done; a canary whose path is gone fails at once."""

from __future__ import annotations

from phaseroute.schemas.enums import QualityTier
from phaseroute.streams.core import Dispatch, FailRequest, FleetObserved, RequestQueued, ResultReceived
from tests.core.fleet import admit, core, job, pool

CANARY = "_canary"


def canary(i: int, pin: tuple[str, str], now: float) -> RequestQueued:
    return RequestQueued(f"canary-{i}", "_canary/round-1", CANARY, f"c{i}", "m", 50, 8, now + 3600, 0,
                         QualityTier.EXACT, 0.0, pin)


def test_canaries_stay_within_their_share_while_a_tenant_waits() -> None:
    now = 1000.0
    c = core(now)
    admit(c, job("flood", 2000, now), now)
    for i in range(300):
        c.handle(canary(i, ("a", "b") if i % 2 else ("a", "a"), now), now)
    running: list[Dispatch] = []
    t = now
    def flood_waiting() -> int:
        return next((r.queued_requests for r in c.dispatch.fair.report() if r.tenant == "acme"), 2000)

    while flood_waiting() > 500:
        t += 0.25
        c.handle(FleetObserved((pool("a", t), pool("b", t))), t)
        out = c.tick(t)
        running += [d for d in out if isinstance(d, Dispatch)]
        for d in running[:12]:  # the fleet finishes 12 requests a tick
            c.handle(ResultReceived(d.work.request_id, d.work.job_id, True, d.work.prompt_tokens, 8), t)
            if d.work.tenant == CANARY:  # exactly the path it measures
                i = int(d.work.request_id.split("-")[1])
                assert (d.prefill_pool, d.decode_pool) == (("a", "b") if i % 2 else ("a", "a")) and not d.speculative
        running = running[12:]
    served = {r.tenant: r for r in c.dispatch.fair.report()}
    assert served["acme"].queued_requests > 0, "the flood must still wait for the share to mean anything"
    share = served[CANARY].served_cost / (served[CANARY].served_cost + served["acme"].served_cost)
    assert 0.01 < share <= 0.031, share
    assert served[CANARY].in_flight <= c.config.canary_max_in_flight
    done = [rid for rid in c.dispatch.requests if rid.startswith("canary-")]
    assert len(done) < 300, "finished canaries are forgotten (a canary belongs to no job)"


def test_a_canary_whose_path_is_gone_fails_at_once() -> None:
    now = 1000.0
    c = core(now)
    c.handle(canary(0, ("a", "nowhere"), now), now)
    out = c.tick(now + 0.25)
    failed = [d for d in out if isinstance(d, FailRequest)]
    assert [f.code for f in failed] == ["path_gone"] and "a -> nowhere" in failed[0].reason
    assert not [d for d in out if isinstance(d, Dispatch)]
    c.handle(ResultReceived("canary-0", "_canary/round-1", False, 50, 0), now + 1)
    assert "canary-0" not in c.dispatch.requests


def test_canaries_beside_a_job_released_whole_wait_for_their_share() -> None:
    """A job smaller than the fleet's free slots leaves nothing queued; weights would then hand
    the canaries the rest of the fleet. Their token share holds while the job runs instead."""
    now = 1000.0
    c = core(now)
    admit(c, job("small", 20, now), now)  # 20 requests, 32 free slots
    for i in range(10):
        c.handle(canary(i, ("a", "a"), now), now)
    released: dict[str, int] = {}
    running: list[Dispatch] = []
    for k in range(1, 9):  # the job runs for two seconds: nothing of it finishes yet
        t = now + 0.25 * k
        c.handle(FleetObserved((pool("a", t), pool("b", t))), t)
        for d in c.tick(t):
            if isinstance(d, Dispatch):
                running.append(d)
                released[d.work.tenant] = released.get(d.work.tenant, 0) + d.work.prompt_tokens + 8
    assert released.get("acme") == 20 * 58
    assert released.get(CANARY, 0) <= c.config.canary_share * sum(released.values())
    t = now + 2.25
    for d in running:
        c.handle(ResultReceived(d.work.request_id, d.work.job_id, True, d.work.prompt_tokens, 8), t)
    c.handle(FleetObserved((pool("a", t), pool("b", t))), t)
    after = [d for d in c.tick(t) if isinstance(d, Dispatch)]
    assert [d.work.tenant for d in after] == [CANARY] * c.config.canary_max_in_flight  # the idle fleet is theirs


def test_a_withdrawn_round_s_queued_canaries_fail_and_its_running_ones_run_on() -> None:
    from phaseroute.streams.core import CancelRequested

    now = 1000.0
    c = core(now)
    admit(c, job("flood", 200, now), now)
    for i in range(10):
        c.handle(canary(i, ("a", "a"), now), now)
    running: list[str] = []
    t = now
    while not running:  # the flood runs until the canaries' share lets one go
        t += 0.25
        c.handle(FleetObserved((pool("a", t), pool("b", t))), t)
        for d in c.tick(t):
            if isinstance(d, Dispatch) and d.work.tenant == CANARY:
                running.append(d.work.request_id)
            elif isinstance(d, Dispatch):
                c.handle(ResultReceived(d.work.request_id, d.work.job_id, True, d.work.prompt_tokens, 8), t)
        assert t < now + 10
    assert len(running) < 10
    # another tenant naming the canaries' job changes nothing
    assert c.handle(CancelRequested("_canary/round-1", "acme", "not yours"), t) == []
    out = c.handle(CancelRequested("_canary/round-1", CANARY, "round closed"), t)
    failed = [d for d in out if isinstance(d, FailRequest)]
    assert sorted(f.work.request_id for f in failed) == sorted(f"canary-{i}" for i in range(10) if f"canary-{i}" not in running)
    assert {f.code for f in failed} == {"canary_withdrawn"} and "round closed" in failed[0].reason
    queued = {r.tenant: r.queued_requests for r in c.dispatch.fair.report()}
    assert queued.get(CANARY, 0) == 0 and queued["acme"] > 0  # the flood's queue is untouched
    assert all(c.dispatch.requests[rid].status.is_open for rid in running)
