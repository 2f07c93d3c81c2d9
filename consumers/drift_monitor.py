"""The drift monitor: canaries through every path, drift per path, quality into the profiles.

Life of a canary round on one path (model M, prefill pool P, decode pool D; colocated when
P == D), started when the path is due and has no round open. A new path (a new pool, or a
pool's variant changed) is due at once; a path is due again ``interval_s`` after its last round
while its state moves, and the wait doubles (up to ``max_interval_s``) with every round that
leaves a HEALTHY path as it was — frequent for new or changing paths, rare for stable ones:

1. ``dispatch``: each canary of M's set (``engine.canaries``) goes twice to ``requests.pending``
   as a request of the reserved tenant ``_canary``, pinned to the path P -> D, with its probe:
   GREEDY (a free greedy run) and FORCED (teacher-forced on the reference tokens, the
   reference's top-K probed at every position). The control plane's fair scheduler releases
   canaries like any tenant's work, within a small share (``CoreConfig.canary_share``), and
   places each on exactly its path, so the prefill worker, the KV store and the decode worker of
   the production path run it; results come back on ``canary.results``.
2. ``on_result``: a result joins its open round by request id.
3. ``close_due``: once every result is in (or ``round_timeout_s`` passed and those in can decide,
   or ``round_give_up_s`` passed; canaries still out are then withdrawn by a CANCEL of the
   round's canary job on ``jobs.commands``), the round's drift is computed against the
   reference (``engine.drift``), the quality policy steps the path's state
   (``streams.policy.quality``), and the monitor publishes a ``drift_measurement``
   (``telemetry.drift``, stored in ClickHouse by the telemetry sink), the path's quality row
   (compacted ``profiles``, read by the router through ``ProfileView``) and, when the path was
   demoted or recovered, a ``quality_alert`` (``quality.alerts``).

A restarted monitor takes each path's last state from the ``profiles`` topic (``restore``).
``drift_monitor_service.MonitorService`` wires the monitor to Kafka; the monitor itself only calls
``send``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from phaseroute.engine.canaries import Canary, CanarySet, load_canaries
from phaseroute.engine.drift import DriftMetrics, aggregate, canary_drift
from phaseroute.engine.errors import UnknownNameError
from phaseroute.infra import topics
from phaseroute.schemas.enums import CanaryMode, JobCommandKind, QualityTier
from phaseroute.schemas.ids import CANARY_TENANT, profile_key, request_id
from phaseroute.schemas.ops_records import DriftMeasurement, ProfileRow, QualityAlert
from phaseroute.schemas.records import JobCommand, Request
from phaseroute.streams.policy import Phase, PoolState
from phaseroute.streams.policy.quality import PathState, QualityConfig, QualityState, QualityVerdict, step

log = logging.getLogger(__name__)
DRIFT_TOPIC = topics.TELEMETRY_DRIFT
ALERTS_TOPIC = topics.QUALITY_ALERTS
REQUESTS_TOPIC = topics.REQUESTS_PENDING
MODES = tuple(CanaryMode)
KEEP_CLOSED = 200  # closed rounds kept in memory (for reports and tests)
Send = Callable[[str, str, str, dict[str, Any]], None]  # (topic, key, kind, record)


@dataclass(frozen=True)
class MonitorConfig:
    interval_s: float = 60.0
    """Seconds between the starts of two rounds on a path whose quality moves (or was never seen)..."""
    max_interval_s: float = 960.0
    """...doubling per round that leaves a HEALTHY path as it was, up to this."""
    round_timeout_s: float = 180.0
    """A round closes with the results it has after this long (lost canaries count as missing),
    when they are enough to decide (``quality.min_positions``)..."""
    round_give_up_s: float = 960.0
    """...else it waits for its late canaries up to this long. The fair scheduler releases canaries
    within a small share, so on a saturated slow pool a round can outlast the timeout: closing it
    then dropped the canaries already run and started the round again (at a 1% share on this
    machine's engine no round ever decided; ``phaseroute sim drift``)."""
    canaries: int = 8
    """Canaries of the set run per path and round (the first N; each runs GREEDY and FORCED)."""
    quality: QualityConfig = field(default_factory=QualityConfig)
    only_pools: tuple[str, ...] = ()
    """Measure only paths between these pools (empty: every live pool)."""
    profiles_topic: str = topics.PROFILES
    drift_topic: str = DRIFT_TOPIC
    alerts_topic: str = ALERTS_TOPIC

    def __post_init__(self) -> None:
        if not 0 < self.round_timeout_s <= self.round_give_up_s:
            raise ValueError(f"MonitorConfig needs 0 < round_timeout_s <= round_give_up_s, got "
                             f"{self.round_timeout_s!r} and {self.round_give_up_s!r}")


@dataclass(frozen=True)
class Path:
    model: str
    src: str  # prefill pool
    dst: str  # decode pool
    src_variant: str
    dst_variant: str

    @property
    def colocated(self) -> bool:
        return self.src == self.dst

    @property
    def label(self) -> str:
        return self.src if self.colocated else f"{self.src}->{self.dst}"


@dataclass
class OpenRound:
    path: Path
    number: int
    started_at: float
    expected: dict[str, tuple[str, CanaryMode]]  # request_id -> (canary_id, mode)
    job_id: str = ""  # the canaries' job id in the control plane (what a withdrawal names)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def complete(self) -> bool:
        return len(self.results) >= len(self.expected)


def paths_of(pools: Iterable[PoolState], models: Iterable[str]) -> list[Path]:
    """Every colocated and disaggregated path among the alive pools, per model."""
    alive = [p for p in pools if p.alive and p.workers > 0]
    out = []
    for model in sorted(models):
        loaded = [p for p in alive if model in p.models]
        for a in sorted(loaded, key=lambda p: p.name):
            for b in sorted(loaded, key=lambda p: p.name):
                if a.serves(Phase.PREFILL) and b.serves(Phase.DECODE) and (a.name != b.name or a.serves(Phase.DECODE)):
                    out.append(Path(model, a.name, b.name, a.variant, b.variant))
    return out


def canary_request(cs: CanarySet, canary: Canary, mode: CanaryMode, path: Path, job_id: str, now: float) -> dict[str, Any]:
    """The ``request`` (for ``requests.pending``) of one canary run pinned to ``path``."""
    rid = request_id(job_id, f"{path.label}/{canary.canary_id}/{mode.value}")
    forced = mode is CanaryMode.FORCED
    max_tokens = len(canary.tokens) if forced else cs.max_tokens
    now_ms = int(now * 1000)
    return {
        "request_id": rid, "job_id": job_id, "tenant": CANARY_TENANT, "custom_id": f"{canary.canary_id}/{mode.value}",
        "priority": 0, "submitted_at": now_ms, "deadline": now_ms + 3_600_000, "model": path.model,
        "prompt": canary.prompt, "prompt_tokens": len(canary.prompt_ids), "max_tokens": max_tokens,
        "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": max_tokens, "seed": None, "stop": []},
        "quality_tier": QualityTier.EXACT.value, "quality_tolerance": None, "pinned_prefill_pool": path.src,
        "pinned_decode_pool": path.dst,
        "canary": {
            "canary_id": f"{cs.model}/{cs.version}/{canary.canary_id}", "mode": mode.value,
            "forced_token_ids": list(canary.tokens) if forced else [],
            "probe_token_ids": [i for row in canary.top_ids for i in row] if forced else [],
            "probe_width": cs.top_k if forced else 0,
        },
    }


def round_metrics(cs: CanarySet, rnd: OpenRound) -> DriftMetrics | None:
    """Drift of the canaries whose two runs both came back; None when none did."""
    by_canary: dict[str, dict[str, dict[str, Any]]] = {}
    for rid, result in rnd.results.items():
        canary_id, mode = rnd.expected[rid]
        by_canary.setdefault(canary_id, {})[mode] = result
    drifts = []
    for canary in cs.canaries:
        runs = by_canary.get(canary.canary_id, {})
        if set(runs) != set(MODES):
            continue
        trace = runs[CanaryMode.FORCED].get("canary_trace") or {"argmax_ids": [], "probe_logprobs": []}
        width, lps = cs.top_k, trace["probe_logprobs"]
        probes = [lps[i * width : (i + 1) * width] for i in range(len(trace["argmax_ids"]))]
        drifts.append(canary_drift(canary.canary_id, canary.tokens, canary.top_logprobs,
                                   runs[CanaryMode.GREEDY]["output_token_ids"], trace["argmax_ids"], probes))
    return aggregate(drifts) if drifts else None


def _figures(m: DriftMetrics) -> dict[str, float]:
    return {"greedy_agreement": m.greedy_agreement, "top1_agreement": m.top1_agreement, "mean_kl": m.mean_kl,
            "max_kl": m.max_kl}


def drift_record(rnd: OpenRound, cs: CanarySet, m: DriftMetrics, verdict: QualityVerdict, received: int,
                 now: float) -> dict[str, Any]:
    p = rnd.path
    return {
        "measurement_id": f"{p.model}|{p.src}|{p.dst}|{rnd.number}", "model": p.model, "prefill_pool": p.src,
        "decode_pool": p.dst, "colocated": p.colocated, "prefill_variant": p.src_variant, "decode_variant": p.dst_variant,
        "canary_set": f"{cs.model}/{cs.version}", "round": rnd.number, "canaries_sent": len(rnd.expected),
        "canaries_received": received, "positions": m.positions, **_figures(m),
        "first_divergence_mean": m.first_divergence_mean, "first_divergence_min": m.first_divergence_min,
        "quality_score": m.top1_agreement, "exact_ok": verdict.exact_ok, "state": verdict.state.state.name,
        "reason": verdict.reason, "at": int(now * 1000),
    }


def quality_row(rnd: OpenRound, cs: CanarySet, m: DriftMetrics, verdict: QualityVerdict, config: MonitorConfig,
                now: float) -> tuple[str, dict[str, Any]]:
    """(key, ``profile_row``) carrying the path's quality for the router."""
    p = rnd.path
    record = {
        "model": p.model, "phase": "DECODE", "pool": p.dst, "variant": p.dst_variant, "source_pool": p.src,
        "source": "TELEMETRY", "batch_curve": [], "step_latency_s_p50": 0.0, "step_latency_s_p90": 0.0,
        "step_latency_s_p99": 0.0, "tokens_per_s": 0.0, "mem_bytes_per_token": 0.0, "kv_bytes_per_token": 0.0,
        "transfer_bytes_per_s": None, "transfer_latency_s": None, "error_rate": 0.0,
        "quality_score": m.top1_agreement, "samples": m.positions, "window_s": config.interval_s,
        "updated_at": int(now * 1000),
        "path_quality": {"exact_ok": verdict.exact_ok, "state": verdict.state.state.name, **_figures(m),
                         "canary_set": f"{cs.model}/{cs.version}", "reason": verdict.reason},
    }
    return profile_key(p.model, "QUALITY", p.dst, p.dst_variant, source_pool=p.src), record


class DriftMonitor:
    """Rounds, results and quality states; publishes through ``send`` (see the module docstring)."""

    def __init__(self, config: MonitorConfig, send: Send, canary_sets: dict[str, CanarySet] | None = None) -> None:
        self.config, self.send = config, send
        self.sets: dict[str, CanarySet | None] = dict(canary_sets or {})
        self.states: dict[tuple[str, str, str], PathState] = {}
        self.open: dict[str, OpenRound] = {}  # request_id -> its round
        self.last_start: dict[Path, float] = {}
        self.interval: dict[Path, float] = {}  # the wait before the path's next round (adaptive)
        self.rounds = 0
        self.run_id = uuid.uuid4().hex[:8]
        self.closed: list[tuple[OpenRound, DriftMetrics | None, QualityVerdict | None]] = []  # the latest KEEP_CLOSED

    def canary_set(self, model: str) -> CanarySet | None:
        if model not in self.sets:
            try:
                self.sets[model] = load_canaries(model)
            except UnknownNameError as exc:
                log.warning("no drift canaries for model %s: %s", model, exc)
                self.sets[model] = None
        return self.sets[model]

    def restore(self, profile_records: Iterable[dict[str, Any]]) -> int:
        """Take each path's state from the latest path-quality rows of the ``profiles`` topic."""
        n = 0
        for record in profile_records:
            quality = record.get("path_quality")
            if quality is not None:
                key = (record["model"], record["source_pool"] or record["pool"], record["pool"])
                self.states[key] = PathState(QualityState[quality["state"]])
                n += 1
        return n

    def dispatch(self, pools: Iterable[PoolState], now: float) -> list[OpenRound]:
        """Start a round on every path that is due and has none open."""
        pools = [p for p in pools if not self.config.only_pools or p.name in self.config.only_pools]
        busy = {rnd.path for rnd in self.open.values()}
        started = []
        for path in paths_of(pools, {m for p in pools for m in p.models}):
            cs = self.canary_set(path.model)
            wait = self.interval.get(path, self.config.interval_s)
            if cs is None or path in busy or now - self.last_start.get(path, -1e18) < wait:
                continue
            self.rounds += 1
            job_id = f"_canary-{self.run_id}-{self.rounds}"
            rnd = OpenRound(path, self.rounds, now, {}, job_id)
            for canary in cs.canaries[: self.config.canaries]:
                for mode in MODES:
                    work = canary_request(cs, canary, mode, path, job_id, now)
                    rnd.expected[work["request_id"]] = (canary.canary_id, mode)
                    self.open[work["request_id"]] = rnd
                    self.send(REQUESTS_TOPIC, CANARY_TENANT, Request.KIND, work)
            self.last_start[path] = now
            started.append(rnd)
        return started

    def on_result(self, result: dict[str, Any]) -> bool:
        rnd = self.open.get(result["request_id"])
        if rnd is None or result.get("canary") is None or result["status"] != "OK":
            return False
        rnd.results[result["request_id"]] = result
        return True

    def close_due(self, now: float) -> list[OpenRound]:
        """Close complete rounds, timed-out ones that can decide, and those past their give-up
        time: measure, step the policy, publish."""
        due = {id(r): r for r in self.open.values() if self._due(r, now)}
        for rnd in due.values():
            for rid in rnd.expected:
                self.open.pop(rid, None)
            self._close(rnd, now)
        return list(due.values())

    def _due(self, rnd: OpenRound, now: float) -> bool:
        age = now - rnd.started_at
        if rnd.complete() or age >= self.config.round_give_up_s:
            return True
        if age < self.config.round_timeout_s:
            return False
        cs = self.canary_set(rnd.path.model)
        metrics = round_metrics(cs, rnd) if cs is not None else None
        return metrics is not None and metrics.positions >= self.config.quality.min_positions

    def _close(self, rnd: OpenRound, now: float) -> None:
        p, cs = rnd.path, self.canary_set(rnd.path.model)
        assert cs is not None
        metrics = round_metrics(cs, rnd)
        received, rnd.results = len(rnd.results), {}  # the figures are all that is kept
        if received < len(rnd.expected):
            self._withdraw(rnd, received, now)
        del self.closed[:-KEEP_CLOSED]
        if metrics is None:
            log.warning("round %d on %s: no canary came back within %.0f s", rnd.number, p.label, now - rnd.started_at)
            self.closed.append((rnd, None, None))
            self.interval[p] = self.config.interval_s  # measure it again soon
            return
        path_key = (p.model, p.src, p.dst)
        before = self.states.get(path_key, PathState())
        verdict = step(before, metrics, self.config.quality)
        self.states[path_key] = verdict.state
        steady = verdict.state.state is QualityState.HEALTHY and before.state is QualityState.HEALTHY
        wait = self.interval.get(p, self.config.interval_s)
        self.interval[p] = min(2 * wait, self.config.max_interval_s) if steady else self.config.interval_s
        self.closed.append((rnd, metrics, verdict))
        pair_key = f"{p.model}|{p.src}|{p.dst}"
        record = drift_record(rnd, cs, metrics, verdict, received, now)
        self.send(self.config.drift_topic, pair_key, DriftMeasurement.KIND, record)
        if verdict.decided:
            key, row = quality_row(rnd, cs, metrics, verdict, self.config, now)
            self.send(self.config.profiles_topic, key, ProfileRow.KIND, row)
        if verdict.alert is not None:
            kind = verdict.alert.name
            log.warning("quality alert: %s %s (%s)", p.label, kind, verdict.reason or "canaries pass again")
            self.send(self.config.alerts_topic, pair_key, QualityAlert.KIND, {
                "alert_id": f"{pair_key}|{kind}|{rnd.number}", "model": p.model, "prefill_pool": p.src,
                "decode_pool": p.dst, "colocated": p.colocated, "kind": kind,
                "reason": verdict.reason or f"canaries pass the recovery thresholds in {self.config.quality.recover_after} rounds",
                **_figures(metrics), "measurement_id": record["measurement_id"], "at": int(now * 1000),
            })

    def _withdraw(self, rnd: OpenRound, received: int, now: float) -> None:
        """A round closed before all its canaries came back: the control plane drops those
        still queued (a CANCEL of the round's canary job), so they take no more of the share."""
        self.send(topics.JOBS_COMMANDS, rnd.job_id, JobCommand.KIND, {
            "job_id": rnd.job_id, "tenant": CANARY_TENANT, "command": JobCommandKind.CANCEL.value, "at": int(now * 1000),
            "reason": f"drift round {rnd.number} on {rnd.path.label} closed with {received} of {len(rnd.expected)} canaries"})

    def tick(self, pools: Iterable[PoolState], now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.close_due(now)
        self.dispatch(pools, now)
