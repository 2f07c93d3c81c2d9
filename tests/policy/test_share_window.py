"""A token share cap (the drift canaries' tenant): it holds while the others' work runs, not
only while it waits; it yields to free capacity when nobody else has work; a release given back
leaves the window; releases older than the window are forgotten; a bad cap is refused by value."""

from __future__ import annotations

import math

import pytest

from phaseroute.streams.policy import FairConfig, FairScheduler, FreeCapacity, RequestWork
from phaseroute.streams.policy.share_window import ShareWindow

TOKENS = 500 + 100  # one request: 500 prompt + 100 expected output tokens


def work(tenant: str, n: int) -> list[RequestWork]:
    return [RequestWork(f"{tenant}-job/{i}", f"{tenant}-job", tenant, "m", 500, 100, None) for i in range(n)]


def capped(share: float = 0.03, **kw: object) -> FairScheduler:
    return FairScheduler(FairConfig(tenant_max_token_share={"canary": share}, urgency_bound=0.0, **kw))  # type: ignore[arg-type]


def released_tokens(s: FairScheduler, free: int, now: float) -> dict[str, int]:
    out: dict[str, int] = {}
    for rel in s.schedule(FreeCapacity(free), now).releases:
        out[rel.request.tenant] = out.get(rel.request.tenant, 0) + TOKENS
    return out


def test_the_cap_holds_while_the_other_tenant_s_job_runs_with_its_queue_empty() -> None:
    s = capped()
    for r in work("acme", 400) + work("canary", 100):
        s.enqueue(r, 0.0)
    # The fleet takes everything at once: acme's whole job is released, its queue is empty, and
    # weights alone would then hand the canaries all the free room beside it.
    got = released_tokens(s, 1000, 0.0)
    assert got["acme"] == 400 * TOKENS
    assert 0 < got.get("canary", 0) <= 0.03 * (got["acme"] + got["canary"])
    assert [r.queued_requests for r in s.report() if r.tenant == "canary"] == [100 - got["canary"] // TOKENS]
    # While acme's work is still running nothing more is released to the canaries...
    assert released_tokens(s, 1000, 1.0) == {}
    # ...and once it is all done the canaries take the idle fleet.
    for i in range(400):
        assert s.on_finished(f"acme-job/{i}", 2.0, 100)
    assert released_tokens(s, 1000, 2.0) == {"canary": (100 - got["canary"] // TOKENS) * TOKENS}


def test_the_uncapped_control_takes_the_free_room_beside_a_job_released_whole() -> None:
    s = FairScheduler(FairConfig(urgency_bound=0.0))
    for r in work("acme", 400) + work("canary", 100):
        s.enqueue(r, 0.0)
    assert released_tokens(s, 1000, 0.0) == {"acme": 400 * TOKENS, "canary": 100 * TOKENS}


def test_a_release_given_back_leaves_the_window_and_old_releases_expire() -> None:
    s = capped(0.25, share_window_s=10.0)
    for r in work("acme", 3) + work("canary", 2):
        s.enqueue(r, 0.0)
    # 3 acme requests allow (0.25 * 3 - 0) / 0.75 = 1 canary request of the same size.
    assert released_tokens(s, 10, 0.0) == {"acme": 3 * TOKENS, "canary": TOKENS}
    assert s.unrelease("canary-job/0")  # it did not run: its tokens leave the window
    s.enqueue(work("canary", 1)[0], 0.5)
    assert released_tokens(s, 10, 0.5) == {"canary": TOKENS}
    # Past the window acme's releases are forgotten: acme still runs, so the canary gets nothing.
    assert released_tokens(s, 10, 11.0) == {}
    s.enqueue(work("acme", 4)[3], 11.0)  # new acme work in the window makes room again
    assert released_tokens(s, 10, 11.0) == {"acme": TOKENS}


def test_the_window_s_arithmetic() -> None:
    w = ShareWindow()
    assert w.room("c", 0.1) == 0.0  # nothing released yet: no share of nothing
    w.add("a/1", "a", 900.0, 0.0)
    assert w.room("c", 0.1) == pytest.approx(100.0)  # 100 of 1000 is 10%
    w.add("c/1", "c", 100.0, 1.0)
    assert w.room("c", 0.1) == 0.0 and w.tokens("c") == 100.0
    w.add("c/1", "c", 100.0, 2.0)  # released again (a retry): counted once, at its new time
    assert w.total == 1000.0
    w.expire(1.5)  # a/1 leaves; c/1's first release is superseded, its second stays
    assert (w.total, w.tokens("a"), w.tokens("c")) == (100.0, 0.0, 100.0)
    w.remove("c/1")
    w.remove("never-added")
    assert w.total == 0.0 and w.room("c", 0.5) == 0.0


@pytest.mark.parametrize("share", [0.0, 1.0, -0.1, 1.5, math.nan])
def test_a_share_outside_0_1_is_refused_by_value(share: float) -> None:
    with pytest.raises(ValueError, match=r"tenant_max_token_share\['canary'\]"):
        FairConfig(tenant_max_token_share={"canary": share})


def test_a_window_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="share_window_s"):
        FairConfig(share_window_s=0.0)
