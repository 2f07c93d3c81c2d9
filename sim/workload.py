"""Workload specs: trace requests become offline batch jobs of weighted tenants with deadlines.

A workload spec (YAML or JSON)::

    name: azure-code
    trace: ../shared/data/traces/azure2023_code.csv   # either trace format (see traces.py)
    seed: 7
    speedup: 1.0        # replay the trace this many times faster (10 = the hour in 6 minutes)
    replicate: 1        # overlay this many copies of the trace, each rotated by a random phase
    max_requests: 0     # keep only the first N requests (0 = all)
    load: 0.7           # optional: pick the speedup that offers this fraction of the fleet's capacity
    tenants:
      - {name: search, weight: 2, priority: 1, share: 0.5, model: llama-3-8b,
         job_size: [50, 400], deadline_min: [30, 360], quality: exact}

Each request is given to a tenant at random with probability ``share``; each tenant's
requests, in arrival order, are cut into jobs of ``job_size`` requests (uniform draw). A job
is submitted when its last request has arrived (the batch is complete) and carries a deadline
``deadline_min`` minutes later (uniform draw). Everything is drawn from ``seed``.

Relative paths of traces are tried against the current directory, then the spec's folder and
each folder above it, then ``$PHASEROUTE_TRACE_DIR`` (file name only).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from phaseroute.sim.errors import SpecError
from phaseroute.sim.specio import Fields, load_spec
from phaseroute.sim.traces import Trace, read_trace


@dataclass(frozen=True)
class Tenant:
    name: str
    weight: float
    priority: int
    share: float
    model: str
    job_size: tuple[int, int]
    deadline_s: tuple[float, float]
    quality: str


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    trace_path: Path
    seed: int
    speedup: float
    replicate: int
    max_requests: int
    load: float | None
    tenants: tuple[Tenant, ...]


@dataclass(frozen=True)
class Workload:
    """Column arrays. Requests are grouped by job: job j owns rows first[j] .. first[j]+count[j]-1."""

    name: str
    trace: str
    speedup: float
    tenants: tuple[Tenant, ...]
    req_job: np.ndarray        # int32
    req_prompt: np.ndarray     # int64
    req_output: np.ndarray     # int64
    job_tenant: np.ndarray     # int32
    job_submit: np.ndarray     # float64 seconds
    job_deadline: np.ndarray   # float64 seconds (absolute)
    job_first: np.ndarray      # int64
    job_count: np.ndarray      # int64

    @property
    def n_requests(self) -> int:
        return len(self.req_job)

    @property
    def n_jobs(self) -> int:
        return len(self.job_submit)

    @property
    def job_tokens(self) -> np.ndarray:
        per_req = self.req_prompt + self.req_output
        return np.add.reduceat(per_req, self.job_first) if self.n_jobs else np.zeros(0)

    @property
    def span_s(self) -> float:
        """The window over which the load is offered: first to last job submission (at least 1 s)."""
        return max(float(self.job_submit.max() - self.job_submit.min()), 1.0) if self.n_jobs else 1.0

    def job_model(self) -> list[str]:
        return [self.tenants[t].model for t in self.job_tenant]

    def summary(self) -> dict[str, Any]:
        tokens = float((self.req_prompt + self.req_output).sum())
        return {
            "name": self.name, "trace": self.trace, "requests": self.n_requests, "jobs": self.n_jobs,
            "speedup": round(self.speedup, 4), "span_s": round(self.span_s, 1),
            "prompt_tokens_mean": round(float(self.req_prompt.mean()), 1),
            "output_tokens_mean": round(float(self.req_output.mean()), 1),
            "offered_tokens_per_s": round(tokens / self.span_s, 1),
            "tenants": [{"name": t.name, "weight": t.weight, "priority": t.priority, "model": t.model} for t in self.tenants],
        }

    def rescaled(self, factor: float) -> Workload:
        """The same jobs submitted ``factor`` times faster (deadline durations unchanged)."""
        rel = self.job_deadline - self.job_submit
        submit = self.job_submit / factor
        return replace(self, speedup=self.speedup * factor, job_submit=submit, job_deadline=submit + rel)


def _find_trace(value: str, spec_dir: Path | None, where: str) -> Path:
    path = Path(value)
    tried = [path]
    if not path.is_absolute():
        if spec_dir is not None:
            tried += [d / path for d in (spec_dir, *spec_dir.resolve().parents)]
        env = os.environ.get("PHASEROUTE_TRACE_DIR")
        if env:
            tried.append(Path(env) / path.name)
    for p in tried:
        if p.is_file():
            return p
    raise SpecError(f"{where}: trace {value!r} not found (tried {', '.join(str(p) for p in tried)})")


def _tenant(f: Fields, default_model: str) -> Tenant:
    f.unknown({"name", "weight", "priority", "share", "model", "job_size", "deadline_min", "deadline_s", "quality"})
    size = f.range("job_size", [50, 400], lo=1)
    if f.has("deadline_s"):
        deadline = f.range("deadline_s", lo=1)
    else:
        lo, hi = f.range("deadline_min", [30, 360], lo=0.01)
        deadline = (lo * 60, hi * 60)
    return Tenant(
        name=f.str("name"), weight=f.num("weight", 1.0, lo=0, strict_lo=True), priority=f.int("priority", 0),
        share=f.num("share", 1.0, lo=0, strict_lo=True), model=f.str("model", default_model),
        job_size=(int(size[0]), int(size[1])), deadline_s=deadline,
        quality=f.str("quality", "exact", choices=("exact", "approximate")),
    )


def parse_workload(data: dict[str, Any], where: str = "<workload>", spec_dir: Path | None = None) -> WorkloadSpec:
    top = Fields(data, where)
    top.unknown({"name", "trace", "seed", "speedup", "replicate", "max_requests", "load", "tenants", "model", "description"})
    model = top.str("model", "llama-3-8b")
    raw = top.raw("tenants", [{"name": "default"}])
    if not isinstance(raw, list) or not raw:
        raise SpecError(f"{where}: field 'tenants' must be a non-empty list")
    tenants = tuple(_tenant(Fields(t, f"{where}: tenants[{i}]"), model) for i, t in enumerate(raw))
    if len({t.name for t in tenants}) != len(tenants):
        raise SpecError(f"{where}: tenant names must be unique")
    return WorkloadSpec(
        name=top.str("name", Path(where).stem), trace_path=_find_trace(top.str("trace"), spec_dir, where),
        seed=top.int("seed", 0), speedup=top.num("speedup", 1.0, lo=0, strict_lo=True),
        replicate=top.int("replicate", 1, lo=1), max_requests=top.int("max_requests", 0, lo=0),
        load=top.num("load", lo=0, strict_lo=True) if top.has("load") and top.raw("load") is not None else None,
        tenants=tenants,
    )


def load_workload_spec(ref: str | Path | dict[str, Any]) -> WorkloadSpec:
    data, path = load_spec(ref, "workload")
    return parse_workload(data, str(path) if path else "<workload>", path.parent if path else None)


def _replicated(trace: Trace, copies: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``copies`` overlaid copies of the trace: the first as recorded, each other rotated by a
    random phase; a fractional part is one more rotated copy keeping each request with that
    probability (so the arrival rate scales with ``copies`` while the window stays the trace's)."""
    whole, part = int(math.floor(copies)), copies - math.floor(copies)
    span = max(trace.span_s, 1e-9)
    keep_all = np.ones(len(trace), dtype=bool)
    shares = [1.0] * whole + ([part] if part > 1e-9 else [])
    times, prompts, outputs = [], [], []
    for k, share in enumerate(shares):
        at = trace.arrival_s if k == 0 else (trace.arrival_s + rng.uniform(0, span)) % span
        keep = keep_all if share >= 1.0 else rng.random(len(trace)) < share
        times.append(at[keep])
        prompts.append(trace.prompt_tokens[keep])
        outputs.append(trace.output_tokens[keep])
    t = np.concatenate(times)
    order = np.argsort(t, kind="stable")
    return t[order], np.concatenate(prompts)[order], np.concatenate(outputs)[order]


def build_workload(spec: WorkloadSpec, trace: Trace | None = None, copies: float | None = None) -> Workload:
    """Jobs from the spec's trace (read here unless given), at the spec's speedup; ``copies``
    (> 0, may be fractional: see ``_replicated``) overrides the spec's ``replicate``."""
    if copies is not None and not copies > 0:
        raise ValueError(f"copies of the trace must be > 0, got {copies!r}")
    trace = trace or read_trace(spec.trace_path)
    rng = np.random.default_rng(spec.seed)
    arrival, prompt, output = _replicated(trace, spec.replicate if copies is None else copies, rng)
    if spec.max_requests:
        arrival, prompt, output = arrival[: spec.max_requests], prompt[: spec.max_requests], output[: spec.max_requests]
    arrival = arrival / spec.speedup
    shares = np.array([t.share for t in spec.tenants])
    owner = rng.choice(len(spec.tenants), size=len(arrival), p=shares / shares.sum())
    jobs: list[tuple[float, int, np.ndarray]] = []  # (submit, tenant, request rows)
    for ti, tenant in enumerate(spec.tenants):
        rows = np.flatnonzero(owner == ti)
        start = 0
        while start < len(rows):
            size = int(rng.integers(tenant.job_size[0], tenant.job_size[1] + 1))
            part = rows[start:start + size]
            jobs.append((float(arrival[part[-1]]), ti, part))
            start += size
    jobs.sort(key=lambda j: (j[0], j[1], int(j[2][0])))
    deadlines = np.array([rng.uniform(*spec.tenants[t].deadline_s) for _, t, _ in jobs])
    counts = np.array([len(p) for _, _, p in jobs], dtype=np.int64)
    rows_all = np.concatenate([p for _, _, p in jobs]) if jobs else np.zeros(0, dtype=np.int64)
    submit = np.array([s for s, _, _ in jobs])
    return Workload(
        name=spec.name, trace=str(spec.trace_path), speedup=spec.speedup, tenants=spec.tenants,
        req_job=np.repeat(np.arange(len(jobs), dtype=np.int32), counts),
        req_prompt=prompt[rows_all].astype(np.int64), req_output=output[rows_all].astype(np.int64),
        job_tenant=np.array([t for _, t, _ in jobs], dtype=np.int32),
        job_submit=submit, job_deadline=submit + deadlines,
        job_first=np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64), job_count=counts,
    )
