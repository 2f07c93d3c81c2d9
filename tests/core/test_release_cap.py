"""The release cap: one tick releases and routes at most ``max_releases_per_tick`` requests (it
bounds how long a tick holds the control plane's event loop), says so in ``more_to_release``,
and the slices ticked at once release what one unbounded tick would, in the same order."""

from __future__ import annotations

import pytest

from phaseroute.streams.core import CoreConfig, Dispatch, FleetObserved, ProfilesUpdated

from .fleet import admit, core, job, pool, table

FREE_SLOTS = 32  # the fake fleet: 2 pools x 2 workers x batch 8, one slot per row


def _placed(decisions: list) -> list[tuple[str, str, str]]:
    return [(d.work.request_id, d.prefill_pool, d.decode_pool) for d in decisions if isinstance(d, Dispatch)]


def test_slices_at_the_cap_release_what_one_unbounded_tick_does_in_the_same_order() -> None:
    now = 1000.0
    capped, whole = core(now, max_releases_per_tick=5), core(now, max_releases_per_tick=10**6)
    for c in (capped, whole):
        admit(c, job("j", 40, now), now)
    slices: list[list[tuple[str, str, str]]] = []
    while True:
        slices.append(_placed(capped.tick(now + 0.25)))
        if not capped.more_to_release:
            break
        assert len(slices) < 100, "more_to_release never cleared"
    once = _placed(whole.tick(now + 0.25))
    assert not whole.more_to_release
    assert [len(s) for s in slices] == [5] * 6 + [2]  # 32 free slots: six full slices, then the rest
    assert [p for s in slices for p in s] == once and len(once) == FREE_SLOTS
    # the fleet is full now: the next tick releases nothing and does not ask for another
    assert _placed(capped.tick(now + 0.5)) == [] and not capped.more_to_release


def test_a_tick_under_the_cap_does_not_ask_for_another() -> None:
    now = 1000.0
    c = core(now)  # 10 requests: under the default cap
    admit(c, job("j", 10, now), now)
    assert len(_placed(c.tick(now + 0.25))) == 10 and not c.more_to_release


def test_the_cap_must_be_a_positive_count() -> None:
    with pytest.raises(ValueError, match="max_releases_per_tick"):
        CoreConfig(max_releases_per_tick=0)


def test_releases_no_pool_can_place_use_the_budget_of_the_tick_they_were_released_in() -> None:
    """Work no pool can place (here: its only pool is gone) is given its slot back; the slices of
    one tick still stop once they released as many requests as the fleet had free slots, as one
    unbounded tick would, instead of routing the whole queue at that instant."""
    now = 1000.0
    c = core(now, max_releases_per_tick=5)
    admit(c, job("j", 200, now), now)
    c.handle(FleetObserved((pool("a", now), pool("b", now))), now)  # both pools serve...
    c.handle(ProfilesUpdated(table([], now)), now)  # ...but no profile row: no path can be placed
    released, slices = 0, 0
    while True:
        assert _placed(c.tick(now + 0.25)) == []
        released, slices = released + sum(c.dispatch.released.values()), slices + 1
        if not c.more_to_release:
            break
    assert released == FREE_SLOTS and slices == 7 and c.dispatch.reports.unplaced == FREE_SLOTS
