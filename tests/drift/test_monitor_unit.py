"""The drift monitor without Kafka: rounds, records (schema-valid), policy, restore, and the
profile view turning its quality rows into the router's path quality."""

from __future__ import annotations

from typing import Any

import pytest

from phaseroute.consumers.drift_monitor import DriftMonitor, MonitorConfig, paths_of
from phaseroute.engine.canaries import load_canaries
from phaseroute.schemas import serde
from phaseroute.schemas.examples import example
from phaseroute.streams.policy import Phase, PoolState
from phaseroute.streams.views import ProfileView

MODEL = "smollm2-135m"
NOW = 1_800_000_000.0
PRE, DEC, BOTH = frozenset({Phase.PREFILL}), frozenset({Phase.DECODE}), frozenset({Phase.PREFILL, Phase.DECODE})
POOLS = [PoolState("pre", True, PRE, frozenset({MODEL}), "fp32", 1, 8, 1e9),
         PoolState("int8", True, DEC, frozenset({MODEL}), "int8-dynamic", 1, 8, 1e9),
         PoolState("colo", True, BOTH, frozenset({MODEL}), "fp32", 1, 8, 1e9),
         PoolState("dead", False, BOTH, frozenset({MODEL}), "fp32", 0, 8, 1e9)]


class Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str, dict[str, Any]]] = []

    def __call__(self, topic: str, key: str, kind: str, record: dict[str, Any]) -> None:
        serde.encode(kind, record)  # every record the monitor sends is valid for its schema
        self.sent.append((topic, key, kind, record))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for _, _, k, r in self.sent if k == kind]


def _answer(work: dict[str, Any], damage: float = 0.0) -> dict[str, Any]:
    """The result a pool would send: the reference itself, or with ``damage`` nats off every probe."""
    cs = load_canaries(MODEL)
    canary = cs.by_id()[work["canary"]["canary_id"].rsplit("/", 1)[1]]
    result = example("result")
    result.update(request_id=work["request_id"], job_id=work["job_id"], tenant=work["tenant"], canary=work["canary"])
    tokens = list(canary.tokens)
    if damage:
        tokens = [t + 1 for t in tokens]  # the pool's own choices differ everywhere
    result["output_token_ids"] = tokens
    if work["canary"]["mode"] == "FORCED":
        probes = [v - damage * (i == 0) for row in canary.top_logprobs for i, v in enumerate(row)]
        result["canary_trace"] = {"argmax_ids": tokens, "probe_logprobs": probes}
    return result


def test_paths_of_the_live_pools() -> None:
    labels = [p.label for p in paths_of(POOLS, [MODEL])]
    assert labels == ["colo", "colo->int8", "pre->colo", "pre->int8"]


def test_a_round_measures_each_path_and_demotes_the_lossy_ones() -> None:
    sink = Sink()
    monitor = DriftMonitor(MonitorConfig(interval_s=30, canaries=3), sink)
    rounds = monitor.dispatch(POOLS, NOW)
    works = sink.of("request")
    assert len(rounds) == 4 and len(works) == 4 * 3 * 2
    first = works[0]
    assert first["tenant"] == "_canary" and first["quality_tier"] == "EXACT"
    assert {(t, k) for t, k, kind, _ in sink.sent if kind == "request"} == {("requests.pending", "_canary")}
    forced = next(w for w in works if w["canary"]["mode"] == "FORCED")
    assert forced["max_tokens"] == len(forced["canary"]["forced_token_ids"])
    assert len(forced["canary"]["probe_token_ids"]) == forced["canary"]["probe_width"] * forced["max_tokens"]
    assert {(w["pinned_prefill_pool"], w["pinned_decode_pool"]) for w in works} == {
        ("colo", "colo"), ("colo", "int8"), ("pre", "colo"), ("pre", "int8")}
    assert monitor.dispatch(POOLS, NOW + 1) == []  # rounds open: nothing new
    for w in works:
        monitor.on_result(_answer(w, damage=0.7 if w["pinned_decode_pool"] == "int8" else 0.0))
    closed = monitor.close_due(NOW + 5)
    assert len(closed) == 4 and not monitor.open
    drift = {(r["prefill_pool"], r["decode_pool"]): r for r in sink.of("drift_measurement")}
    assert drift[("colo", "colo")]["mean_kl"] < 1e-9 and drift[("colo", "colo")]["exact_ok"]
    assert drift[("colo", "colo")]["state"] == "HEALTHY" and drift[("colo", "colo")]["greedy_agreement"] == 1.0
    bad = drift[("pre", "int8")]
    assert bad["state"] == "DEMOTED" and not bad["exact_ok"] and bad["top1_agreement"] == 0.0
    assert bad["mean_kl"] > 0.1 and bad["canaries_received"] == bad["canaries_sent"] == 6
    alerts = sink.of("quality_alert")
    assert sorted((a["prefill_pool"], a["decode_pool"], a["kind"]) for a in alerts) == [
        ("colo", "int8", "DEMOTED"), ("pre", "int8", "DEMOTED")]
    # the router's view of the quality rows
    view = ProfileView()
    for record in sink.of("profile_row"):
        view.on_record(serde.decode(serde.encode("profile_row", record), "profile_row")[1])
    quality = view.table().quality
    assert not quality[(MODEL, "pre", "int8")].exact_ok and quality[(MODEL, "pre", "colo")].exact_ok
    assert quality[(MODEL, "colo", "colo")].score == 1.0 and view.table().rows == {}  # no fake profile rows
    keys = {k for t, k, kind, _ in sink.sent if kind == "profile_row"}
    assert f"{MODEL}|QUALITY|int8|int8-dynamic|pre" in keys
    # a restarted monitor takes the states from those rows
    again = DriftMonitor(MonitorConfig(), Sink())
    assert again.restore(sink.of("profile_row")) == 4
    assert again.states[(MODEL, "pre", "int8")].state.name == "DEMOTED"


def test_a_round_closes_on_timeout_with_what_came_back() -> None:
    sink = Sink()
    monitor = DriftMonitor(MonitorConfig(interval_s=30, round_timeout_s=60, canaries=2), sink)
    monitor.dispatch(POOLS[2:3], NOW)  # colo only
    works = sink.of("request")
    for w in works[:2]:  # one canary's two runs come back, the other is lost
        monitor.on_result(_answer(w))
    assert monitor.close_due(NOW + 10) == []
    assert len(monitor.close_due(NOW + 61)) == 1
    [record] = sink.of("drift_measurement")
    assert (record["canaries_sent"], record["canaries_received"]) == (4, 2)
    assert record["positions"] == len(load_canaries(MODEL).canaries[0].tokens) == 8  # min_positions is 8
    # nothing came back in time: the round waits for its late canaries (a small canary share on a
    # saturated pool), and no new round of the path starts meanwhile
    monitor.dispatch(POOLS[2:3], NOW + 100)
    late = sink.of("request")[4:]
    assert monitor.close_due(NOW + 200) == [] and monitor.dispatch(POOLS[2:3], NOW + 200) == []
    for w in late[:2]:
        monitor.on_result(_answer(w))
    assert len(monitor.close_due(NOW + 201)) == 1 and len(sink.of("drift_measurement")) == 2
    # nothing came back by the give-up time: no record, no verdict
    monitor.dispatch(POOLS[2:3], NOW + 300)
    assert monitor.close_due(NOW + 300 + 959) == []
    assert len(monitor.close_due(NOW + 300 + 960)) == 1
    assert len(sink.of("drift_measurement")) == 2 and monitor.closed[-1][1] is None


def test_a_round_timeout_longer_than_its_give_up_is_refused() -> None:
    with pytest.raises(ValueError, match="round_timeout_s <= round_give_up_s, got 600 and 300"):
        MonitorConfig(round_timeout_s=600, round_give_up_s=300)


def test_rounds_are_frequent_for_new_or_moving_paths_and_rare_for_stable_ones() -> None:
    """A stable HEALTHY path waits twice as long after each round (up to max_interval_s); a
    demoted path stays at interval_s; a pool whose variant changed is measured at once."""
    sink = Sink()
    monitor = DriftMonitor(MonitorConfig(interval_s=30, max_interval_s=120, canaries=2), sink)
    pools = POOLS[:3]
    t, starts = NOW, {"colo": [], "pre->int8": []}
    while t < NOW + 600:
        for rnd in monitor.dispatch(pools, t):
            if rnd.path.label in starts:
                starts[rnd.path.label].append(t - NOW)
        for _, _, kind, w in sink.sent:
            if kind == "request":
                monitor.on_result(_answer(w, damage=0.7 if w["pinned_decode_pool"] == "int8" else 0.0))
        sink.sent.clear()
        monitor.close_due(t)
        t += 5
    stable, demoted = starts["colo"], starts["pre->int8"]
    assert [b - a for a, b in zip(stable, stable[1:])][:4] == [30, 60, 120, 120], stable
    assert all(b - a == 30 for a, b in zip(demoted, demoted[1:])), demoted
    changed = [PoolState("colo", True, BOTH, frozenset({MODEL}), "int8-dynamic", 1, 8, 1e9)]
    assert [r.path.label for r in monitor.dispatch(changed, t)] == ["colo"], "a new variant is measured at once"


def test_a_round_closed_early_withdraws_its_late_canaries_and_a_whole_one_does_not() -> None:
    sink = Sink()
    monitor = DriftMonitor(MonitorConfig(interval_s=30, round_timeout_s=60, canaries=2), sink)
    monitor.dispatch(POOLS[2:3], NOW)
    works = sink.of("request")
    for w in works[:2]:
        monitor.on_result(_answer(w))
    assert len(monitor.close_due(NOW + 61)) == 1
    [command] = sink.of("job_command")
    assert command["job_id"] == works[0]["job_id"] and command["tenant"] == "_canary"
    assert command["command"] == "CANCEL" and "closed with 2 of 4 canaries" in command["reason"]
    assert [t for t, _, k, _ in sink.sent if k == "job_command"] == ["jobs.commands"]
    monitor.dispatch(POOLS[2:3], NOW + 100)
    for w in sink.of("request")[4:]:
        monitor.on_result(_answer(w))
    assert len(monitor.close_due(NOW + 101)) == 1 and len(sink.of("job_command")) == 1  # complete: nothing to withdraw
