"""The dispatch ticks' log line: percentiles over a window, parsed back by ``bench control``."""

from phaseroute.streams.tick_stats import LINE, TickStats


def test_a_window_of_ticks_gives_one_line_with_its_percentiles_and_the_most_queued() -> None:
    stats = TickStats(every_s=10.0)
    lines = [stats.add(1000.0 + 0.25 * k, (k % 100 + 1) / 1000.0, queued=5000 - k) for k in range(41)]
    assert lines[:-1] == [None] * 40  # the window closes at the tick 10 s after the first
    parsed = LINE.search(lines[-1] or "")
    assert parsed is not None, lines[-1]
    assert parsed["n"] == "41" and parsed["queued"] == "5000"
    assert float(parsed["p50"]) == 21.0 and float(parsed["max"]) == 41.0
    assert stats.add(1011.0, 0.002, 7) is None  # a new window started
