"""Quality drift through real workers over Kafka, on the real model.

Three pools run as real worker loops (driven in this process, one thread, so two pools can
share one fp32 model): ``pre`` (prefill, fp32), ``int8`` (decode, int8-dynamic) and ``colo``
(both, fp32). The drift monitor service sends its canaries as requests of the ``_canary``
tenant to the real control plane (a ``phaseroute control`` process), whose fair scheduler
releases them onto the paths they are pinned to, as real Kafka messages (prefill worker -> KV
store -> decode worker); the monitor measures each path, and publishes
quality rows that a ``ProfileView`` turns into the router's table. Then the prefill worker
corrupts the KV blobs it hands to ``colo`` (bit flips, CRC recomputed), and the monitor must
demote exactly that path in one round; with the fault gone it recovers. Finally the drift
records read back from Kafka go through the telemetry sink into embedded ClickHouse (a
subprocess: chdb allows one data path per process) and the analysts' views answer.
Figures are printed (``pytest -s``).
"""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer

from phaseroute.config import load_settings
from phaseroute.consumers.drift_monitor import MonitorConfig
from phaseroute.consumers.drift_monitor_service import MonitorService
from phaseroute.consumers.phase_handler import KVBitflips
from phaseroute.consumers.worker import WorkerOptions, build_phase_worker
from phaseroute.infra import provision, topics
from phaseroute.infra.topic_follower import TopicFollower
from phaseroute.schemas import serde
from phaseroute.streams.policy import (
    CurvePoint,
    NoPlacement,
    Phase,
    ProfileRow,
    ProfileSource,
    QualityTier,
    RequestWork,
    RouterConfig,
    RouterState,
    route,
)
from phaseroute.streams.policy.quality import QualityConfig
from phaseroute.streams.shell import RESTORED
from phaseroute.streams.views import ProfileView

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.slow]
MODEL = "smollm2-135m"


class Live:
    """Workers, heartbeats and the monitor service of one test module."""

    def __init__(self, bootstrap: str) -> None:
        tag = uuid.uuid4().hex[:6]
        self.pre, self.int8, self.colo = f"dpre-{tag}", f"dint8-{tag}", f"dcolo-{tag}"
        self.bootstrap = bootstrap
        self.pool_topics = [s for p in (self.pre, self.int8, self.colo) for s in topics.pool_topics(p)]
        self.loops: dict[str, Any] = {}
        self.beats: list[Any] = []
        self.service: MonitorService | None = None
        self.control: subprocess.Popen | None = None

    def start(self, home: Path, fp32: Any, int8: Any, make_topic: Callable[..., str]) -> None:
        provision.provision(self.bootstrap, topics.all_topics() + self.pool_topics)
        settings = load_settings(home=home, bootstrap_servers=self.bootstrap)
        for pool, phase, variant, ex in ((self.pre, "prefill", "fp32", fp32), (self.int8, "decode", "int8-dynamic", int8),
                                         (self.colo, "both", "fp32", fp32)):
            opts = WorkerOptions(pool=pool, phase=phase, variant=variant, threads=1, max_decode_batch=16, heartbeat_s=1.0,
                                 worker_id=f"{pool}-0")
            loop, beat = build_phase_worker(settings, opts, executor=ex)
            loop.consumer.subscribe(list(loop.config.topic_kinds), on_assign=loop._on_assign, on_revoke=loop._on_revoke,
                                    on_lost=loop._on_lost)
            self.loops[pool] = loop
            beat.start()
            self.beats.append(beat)
        self.topics = {k: make_topic(k) for k in ("profiles", "drift", "alerts")}
        # generous limits: four paths' rounds through one shared fp32 model took 140 s on a quiet
        # 2-core machine and over 200 s on a loaded one (a correctness test, not a speed target)
        config = MonitorConfig(interval_s=3600, round_timeout_s=400, canaries=3, quality=QualityConfig(recover_after=1),
                               only_pools=(self.pre, self.int8, self.colo), profiles_topic=self.topics["profiles"],
                               drift_topic=self.topics["drift"], alerts_topic=self.topics["alerts"])
        self.control = subprocess.Popen([sys.executable, "-m", "phaseroute.cli.main", "control"],
                                        stdout=open(home / "control.log", "ab"), stderr=subprocess.STDOUT)
        self._wait_until_restored(home / "control.log")
        self.service = MonitorService(self.bootstrap, config, dead_after_s=30.0)
        self.monitor = self.service.monitor
        self.service.start()

    def _wait_until_restored(self, log_path: Path, timeout_s: float = 600.0) -> None:
        """The rounds are timed from a control plane that serves: its start reads every control
        changelog on the broker, which the earlier tests of a CI run grow (its length is not what
        this module measures). The workers keep polling meanwhile, so the pools are alive when it is."""
        began = time.time()
        while time.time() - began < timeout_s:
            for loop in self.loops.values():
                loop.run_once()
            if RESTORED in log_path.read_text(errors="replace"):
                print(f"\ncontrol plane restored {time.time() - began:.1f} s after its start")
                return
            assert self.control is not None and self.control.poll() is None, \
                f"the control plane exited: {log_path.read_text(errors='replace')[-3000:]}"
            time.sleep(0.2)
        text = log_path.read_text(errors="replace")
        stage = ("still a standby (another control plane holds the lease)" if "holds the control lease" not in text
                 else "active, still recovering its tables")
        raise AssertionError(f"the control plane was not restored within {timeout_s:.0f} s: {stage}; see {log_path}")

    def pump(self, until: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for loop in self.loops.values():
                loop.run_once()
            self.service.run_once(poll_s=0.05)
            if until():
                return
        raise AssertionError(f"{what} not reached within {timeout_s:.0f} s; open rounds: "
                             f"{sorted({r.path.label for r in self.monitor.open.values()})}")

    def rounds(self, n: int, timeout_s: float = 420.0) -> list[Any]:
        """Pump until ``n`` more rounds have closed; return them (round, metrics, verdict)."""
        start, began = len(self.monitor.closed), time.time()
        self.pump(lambda: len(self.monitor.closed) >= start + n and not self.monitor.open, timeout_s, f"{n} round(s)")
        print(f"\n{n} round(s) closed in {time.time() - began:.1f} s")
        return self.monitor.closed[start:]

    def due(self, label: str) -> None:
        """Make only the path ``label`` due for a new round."""
        self.monitor.last_start = {p: t for p, t in self.monitor.last_start.items() if p.label != label}

    def close(self) -> None:
        if self.control is not None:
            self.control.terminate()
            try:
                self.control.wait(60)
            except subprocess.TimeoutExpired:
                self.control.kill()
        for beat in self.beats:
            beat.stop()
        for loop in self.loops.values():
            loop.consumer.close()
            loop.producer.flush_or_raise()
        if self.service is not None:
            self.service.close()
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.delete_topics([s.name for s in self.pool_topics]).values():
            try:
                future.result(timeout=30)
            except Exception:
                pass


@pytest.fixture(scope="module")
def live(bootstrap: str, smol_fp32: Any, smol_int8: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from confluent_kafka.admin import AdminClient, NewTopic

    made: list[str] = []
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def make_topic(prefix: str) -> str:
        name = f"test.drift-{prefix}.{uuid.uuid4().hex[:10]}"
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=30)
        made.append(name)
        return name

    harness = Live(bootstrap)
    try:
        harness.start(tmp_path_factory.mktemp("drift-home"), smol_fp32, smol_int8, make_topic)
        yield harness
    finally:
        harness.close()
    for future in admin.delete_topics(made).values():
        try:
            future.result(timeout=30)
        except Exception:
            pass


def _table(live: Live, expect: set[tuple[str, str]] = frozenset(), timeout_s: float = 30.0) -> Any:
    """The router's table as a ProfileView builds it from the published rows, plus cold-start rows
    that make the int8 pool the fastest decoder (so quality is what keeps exact work away)."""
    view = ProfileView()
    follower = TopicFollower(live.bootstrap, live.topics["profiles"], "profile_row", view.on_record)
    follower.start()
    try:
        assert follower.caught_up.wait(timeout_s), "the profiles topic was not read to its end"
        assert {(s, d) for (_, s, d) in view.table().quality} >= expect, view.table().quality
    finally:
        follower.stop()
    rows = []
    for pool, phase, variant, tps in ((live.pre, Phase.PREFILL, "fp32", 4000.0), (live.colo, Phase.PREFILL, "fp32", 4000.0),
                                      (live.colo, Phase.DECODE, "fp32", 400.0), (live.int8, Phase.DECODE, "int8-dynamic", 1200.0)):
        curve = (CurvePoint(1, tps / 8), CurvePoint(8, tps / 2), CurvePoint(32, tps))
        rows.append(ProfileRow(MODEL, phase, pool, variant, curve, 0.01, 0.02, 0.03, 2000.0, 1000.0, 0.0, 1.0, 100,
                               time.time(), ProfileSource.PROFILER))
    return view.table().with_rows(rows)


def _routes(live: Live, table: Any, tier: QualityTier, tolerance: float = 0.0, n: int = 60) -> tuple[set[tuple[str, str]], Any]:
    pools = [p for p in live.service.pools.states(time.time(), {}, {}).values() if p.name in live.loops]
    state, rng, config, used, last = RouterState(), random.Random(0), RouterConfig(exploration_share=0.3), set(), None
    for i in range(n):
        work = RequestWork(f"r{i}", "j", "t", MODEL, 40, 16, None, tier, tolerance)
        last = route(work, pools, table, state, config, time.time(), rng)
        assert not isinstance(last, NoPlacement), last.reason
        state.record(last, work, time.time(), config)
        used.add((last.prefill_pool, last.decode_pool))
    return used, last


def _print(rounds: list[Any]) -> None:
    for rnd, m, v in rounds:
        print(f"  {rnd.path.label:28s} {rnd.path.src_variant:>5s}->{rnd.path.dst_variant:<13s} greedy {m.greedy_agreement:.3f}"
              f" top1 {m.top1_agreement:.3f} meanKL {m.mean_kl:.3g} maxKL {m.max_kl:.3g}"
              f" firstdiv {m.first_divergence_mean:.2f} -> {v.state.state.value}")


def test_int8_drift_is_measured_and_exact_work_avoids_it(live: Live) -> None:
    rounds = live.rounds(4)
    print("\nround 1 (3 canaries x greedy + forced per path):")
    _print(rounds)
    by = {r.path.label: (m, v) for r, m, v in rounds}
    for label in (live.colo, f"{live.pre}->{live.colo}"):
        m, v = by[label]
        assert v.exact_ok and m.mean_kl < 1e-4 and m.top1_agreement >= 0.99, (label, m)
    for label in (f"{live.pre}->{live.int8}", f"{live.colo}->{live.int8}"):
        m, v = by[label]
        assert not v.exact_ok and m.mean_kl > 0.01 and m.top1_agreement < 0.98, (label, m)  # varies with the batch
    table = _table(live, {(live.colo, live.colo), (live.pre, live.colo), (live.pre, live.int8), (live.colo, live.int8)})
    exact, _ = _routes(live, table, QualityTier.EXACT)
    assert exact and all(d != live.int8 for _, d in exact), exact
    approx, _ = _routes(live, table, QualityTier.APPROXIMATE, tolerance=0.9)
    assert any(d == live.int8 for _, d in approx), approx  # lossy but allowed: and it is the fast decoder


def test_kv_corruption_on_one_path_is_detected_and_that_path_loses_exact_work(live: Live) -> None:
    handler = live.loops[live.pre].handler
    clean = handler.spec
    # 1e-5 of the bits (~170 per 1.7 MB blob): some land in exponent bits in every blob. At 1e-6
    # (~15 per blob) a round can miss: mantissa flips move the KL to ~1e-8, under the threshold.
    handler.spec = dataclasses.replace(clean, kv_bitflips=KVBitflips(1e-5, to_pool=live.colo, seed=1))
    link = f"{live.pre}->{live.colo}"
    live.due(link)
    [(rnd, m, v)] = live.rounds(1)
    print(f"\nKV bit flips (rate 1e-5) on {link}: detected in 1 round = {len(rnd.expected)} canary runs")
    _print([(rnd, m, v)])
    assert rnd.path.label == link and not v.exact_ok and v.alert is not None and v.alert.name == "DEMOTED"
    table = _table(live)
    exact, decision = _routes(live, table, QualityTier.EXACT)
    assert (live.pre, live.colo) not in exact and (live.colo, live.colo) in exact, exact
    assert any(where == link for where, _ in decision.rejected), decision.rejected

    handler.spec = clean
    live.due(link)
    [(rnd, m, v)] = live.rounds(1)
    print("fault removed:")
    _print([(rnd, m, v)])
    assert v.exact_ok and v.alert is not None and v.alert.name == "RECOVERED"


DRIFT_TO_CLICKHOUSE = """
import json, os, sys, time
os.environ["PHASEROUTE_HOME"] = sys.argv[1]  # this process's state dir: its chdb, and the SQL server's token
from phaseroute.config import load_settings
from phaseroute.consumers.handler import WorkItem
from phaseroute.consumers.telemetry_sink import TelemetrySinkHandler
from phaseroute.infra import clickhouse
cfg = load_settings()
client = clickhouse.connect(cfg)
clickhouse.apply_ddl(client, cfg.clickhouse_database)
sink = TelemetrySinkHandler(client, cfg.clickhouse_database)
records = json.load(open(sys.argv[2]))
sink.admit([WorkItem(("t", 0), i, kind, rec, time.time(), time.time()) for i, (kind, rec) in enumerate(records)])
sink.step()
db = cfg.clickhouse_database
out = {}
for view in ("drift_latest", "drift_by_variant", "quality_alert"):
    answer = client.query(f"SELECT * FROM {db}.{view}")
    out[view] = [dict(zip(answer.column_names, map(str, row))) for row in answer.result_rows]
# what the demo summary and `phaseroute drift report --plot` use, through the query server
import socket
from phaseroute.cli.drift_cmds import drift_summary, plot_drift
from phaseroute.consumers.query_server import LockedClient, QueryServer
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
server = QueryServer(LockedClient(client), port, cfg)
server.start()
summary = drift_summary(port, time.time() - 3600, db)
plot_drift(summary["timeline"], sys.argv[3])
server.stop()
out["summary"] = {k: len(v) for k, v in summary.items()}
out["summary_by_variant"] = summary["by_variant"]
print(json.dumps(out, default=str))
"""


def _read(bootstrap: str, topic: str, kind: str) -> list[dict[str, Any]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    out, last = [], time.time()
    try:
        while time.time() - last < 3.0:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                out.append(serde.decode(msg.value(), kind)[1])
                last = time.time()
    finally:
        consumer.close()
    return out


def test_drift_reaches_clickhouse_and_the_views_answer(live: Live, tmp_path: Path) -> None:
    drift = _read(live.bootstrap, live.topics["drift"], "drift_measurement")
    alerts = _read(live.bootstrap, live.topics["alerts"], "quality_alert")
    assert len(drift) == 6 and len(alerts) == 4  # 4 paths + 2 rounds on the link; 2 int8 + demote + recover
    (tmp_path / "records.json").write_text(json.dumps([["drift_measurement", r] for r in drift] +
                                                      [["quality_alert", r] for r in alerts]))
    png = tmp_path / "drift.png"
    proc = subprocess.run([sys.executable, "-c", DRIFT_TO_CLICKHOUSE, str(tmp_path / "home"), str(tmp_path / "records.json"),
                           str(png)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    latest = {r["path"]: r for r in out["drift_latest"]}
    assert latest[f"{live.pre}->{live.int8}"]["exact_ok"] == "False" and latest[live.colo]["exact_ok"] == "True"
    assert latest[f"{live.pre}->{live.colo}"]["rounds"] == "3" and latest[f"{live.pre}->{live.colo}"]["exact_ok"] == "True"
    by_variant = {(r["prefill_variant"], r["decode_variant"], r["colocated"]): r for r in out["drift_by_variant"]}
    assert float(by_variant[("fp32", "int8-dynamic", "False")]["mean_kl"]) > 0.01
    print("\ndrift_by_variant in ClickHouse:")
    for r in out["drift_by_variant"]:
        print("  ", {k: r[k] for k in ("prefill_variant", "decode_variant", "colocated", "rounds", "greedy_agreement",
                                       "top1_agreement", "mean_kl", "max_kl", "first_divergence_mean")})
    assert sorted(a["kind"] for a in out["quality_alert"]) == ["DEMOTED", "DEMOTED", "DEMOTED", "RECOVERED"]
    assert out["summary"] == {"by_variant": 3, "paths": 4, "alerts": 4, "timeline": 6}
    assert png.stat().st_size > 10_000
