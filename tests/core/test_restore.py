"""The control core rebuilt from its store after a restart: what it sends again."""

from __future__ import annotations

from phaseroute.streams.core import ControlCore, CoreConfig, Dispatch, FleetObserved, ProfilesUpdated, ResultReceived
from phaseroute.streams.policy import ModelSpec, PathQuality

from .fleet import MODEL, admit, core, job, pool, table


def test_attempts_resent_after_a_restart_skip_a_path_demoted_since() -> None:
    """Attempts dispatched just before a stop are sent again (their sends may be lost), except
    where the canaries demoted the path for the request's tier in the meantime: sent there again,
    an EXACT request would run on a path the quality policy refuses."""
    now = 1000.0
    first = core(now)
    admit(first, job("j", 8, now), now)
    sent = [d for d in first.tick(now + 0.1) if isinstance(d, Dispatch)]
    assert {d.prefill_pool for d in sent} == {"a", "b"}, "the fake fleet splits the work over both pools"

    again = ControlCore(CoreConfig(models={MODEL: ModelSpec(MODEL, 4096)}), first.store, seed=1)
    demoted = PathQuality(MODEL, "a", "a", 0.91, False, 300, now + 0.5)
    again.handle(FleetObserved((pool("a", now + 1), pool("b", now + 1))), now + 1)
    again.handle(ProfilesUpdated(table(["a", "b"], now).with_rows((), (), (demoted,))), now + 1)
    resent = [d for d in again.restore(now + 1) if isinstance(d, Dispatch)]
    assert {(d.work.request_id, d.attempt) for d in resent} == {
        (d.work.request_id, d.attempt) for d in sent if (d.prefill_pool, d.decode_pool) != ("a", "a")}


def test_pools_that_come_alive_after_the_profiles_share_light_work() -> None:
    """The live order at start: the profile table is read before the pools' first heartbeats.
    Two equal pools that appear then must share a light stream of work (one request at a time,
    each finished before the next: the cost model sees both idle every time), not herd it onto
    the best-scored one: the traffic-share targets must exist without a later profile change."""
    now = 1000.0
    c = ControlCore(CoreConfig(models={MODEL: ModelSpec(MODEL, 4096)}), seed=1)
    c.handle(ProfilesUpdated(table(["a", "b"], now)), now)
    picks = []
    for i in range(20):
        now += 1.0
        c.handle(FleetObserved((pool("a", now), pool("b", now))), now)
        admit(c, job(f"one-{i}", 1, now), now)
        for d in c.tick(now):
            if isinstance(d, Dispatch):
                picks.append(d.prefill_pool)
                c.handle(ResultReceived(d.work.request_id, d.work.job_id, True, d.work.prompt_tokens, 8), now)
    assert len(picks) == 20 and min(picks.count("a"), picks.count("b")) >= 6, picks
