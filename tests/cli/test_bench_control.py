"""`phaseroute bench control`'s reading of the dispatcher's log (the bench itself runs for
minutes on a real broker: a benchmark, not a test)."""

from __future__ import annotations

from phaseroute.cli.bench_control import _restored_at_start
from phaseroute.streams.shell import RESTORED


def test_the_report_says_what_the_dispatcher_restored_before_it_served() -> None:
    """A run that began by reading back an earlier run's finished requests says so (a line as
    the control plane logged it in a second run on one broker)."""
    log = ("[2026-12-07 18:26:01,102] [4541] [INFO] dispatch ticks: 31 in 10.0 s\n"
           f"[2026-12-07 18:26:16,519] [4541] [INFO] {RESTORED}: 20024 requests, 2 jobs from the tables; "
           "0 final results sent again \n")
    assert _restored_at_start(log) == {"requests": 20024, "jobs": 2}


def test_a_log_without_the_line_restored_nothing_known() -> None:
    assert _restored_at_start("[2026-12-07 18:26:01,102] [4541] [INFO] starting\n") is None


def test_the_fake_fleet_reports_its_longest_wait_for_work_and_its_work_per_window() -> None:
    """The fleet's side of the report: work at 100.0-100.2 s, nothing for 31.5 s, work again at
    131.7 s and 135 s (the clock is passed in; no broker is touched before ``start``)."""
    from phaseroute.consumers.instant_fleet import InstantFleet

    fleet = InstantFleet("127.0.0.1:1", pools=1)
    for at in (100.0, 100.1, 100.2, 131.7, 135.0):
        fleet._count(at)
    assert fleet.answered == 5
    assert round(fleet.longest_idle_s, 1) == 31.5
    assert fleet.work_per_window(100.0, 135.0) == [3, 0, 0, 2]
    assert fleet.work_per_window(100.0, 120.0) == [3, 0, 0]  # work after ``until`` is not counted
