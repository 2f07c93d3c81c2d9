"""Calibrating the roofline's efficiency factors from measured profiles.

Measured points (YAML/JSON)::

    accelerator: CPU-2C-AVX2      # catalogue name (peaks come from there)
    model: smollm2-135m
    tp: 1
    points:
      - {phase: prefill, batch_size: 1, prompt_tokens: 256, tokens_per_s: 500}
      - {phase: decode, batch_size: 8, context_tokens: 128, tokens_per_s: 76}

``calibrate`` fits (prefill and decode compute efficiency, memory efficiency, per-step
overhead) by least squares on log throughput; the result goes into a fleet spec's ``efficiency`` block. Profile
rows measured by the engine profiler (``ProfileRow`` objects of the policy package, one curve
per phase) convert to points with ``points_from_rows``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.optimize import least_squares

from phaseroute.schemas.enums import Phase
from phaseroute.sim.catalogue import Accelerator, Catalogue, ModelArch, load_catalogue
from phaseroute.sim.errors import SpecError
from phaseroute.sim.perfmodel import Efficiency, instance_perf
from phaseroute.sim.specio import Fields, load_spec

if TYPE_CHECKING:
    from phaseroute.streams.policy import ProfileRow


@dataclass(frozen=True)
class Point:
    phase: Phase
    batch_size: int
    tokens: int          # prompt tokens (prefill) or context tokens (decode)
    tokens_per_s: float


def load_points(ref: str | Path | dict[str, Any]) -> tuple[str, str, int, list[Point]]:
    data, path = load_spec(ref, "calibration")
    where = str(path or "<calibration>")
    top = Fields(data, where)
    top.unknown({"accelerator", "model", "tp", "points", "source", "description"})
    raw = top.raw("points")
    if not isinstance(raw, list) or not raw:
        raise SpecError(f"{where}: field 'points' must be a non-empty list")
    points = []
    for i, item in enumerate(raw):
        f = Fields(item, f"{where}: points[{i}]")
        phase = f.phase("phase")
        key = "prompt_tokens" if phase is Phase.PREFILL else "context_tokens"
        f.unknown({"phase", "batch_size", key, "tokens_per_s"})
        points.append(Point(phase, f.int("batch_size", 1, lo=1), f.int(key, lo=1), f.num("tokens_per_s", lo=0, strict_lo=True)))
    return top.str("accelerator"), top.str("model"), top.int("tp", 1, lo=1), points


def points_from_rows(rows: Iterable[ProfileRow], prompt_tokens: int, context_tokens: int) -> list[Point]:
    """Measured ProfileRows (policy package) -> points at the given prompt / context length."""
    out = []
    for row in rows:
        phase = row.phase
        for p in row.curve:
            out.append(Point(phase, p.batch_size, prompt_tokens if phase is Phase.PREFILL else context_tokens,
                             p.tokens_per_s))
    return out


def predict(points: list[Point], acc: Accelerator, arch: ModelArch, tp: int, eff: Efficiency) -> np.ndarray:
    perf = instance_perf(acc, arch, tp, eff)
    out = []
    for p in points:
        if p.phase is Phase.PREFILL:
            tokens = p.batch_size * p.tokens
            out.append(tokens / perf.step_time(0, 0, tokens, p.tokens))
        else:
            out.append(p.batch_size / perf.step_time(p.batch_size, p.batch_size * p.tokens))
    return np.array(out)


def calibrate(accelerator: str, model: str, tp: int, points: list[Point], catalogue: Catalogue | None = None) -> dict[str, Any]:
    cat = catalogue or load_catalogue()
    acc, arch = cat.accelerator(accelerator), cat.model(model)
    measured = np.array([p.tokens_per_s for p in points])

    def eff_of(x: np.ndarray) -> Efficiency:
        return Efficiency(compute=float(np.exp(x[0])), memory=float(np.exp(x[1])), step_overhead_s=float(x[2]),
                          decode_compute=float(np.exp(x[3])), tp_scaling=1.0)

    def residual(x: np.ndarray) -> np.ndarray:
        r: np.ndarray = np.log(predict(points, acc, arch, tp, eff_of(x))) - np.log(measured)
        return r

    best = None
    for c0 in (0.1, 0.5):
        for m0 in (0.1, 0.5):
            fit = least_squares(residual, x0=[math.log(c0), math.log(m0), 1e-3, math.log(c0)],
                                bounds=([math.log(1e-3), math.log(1e-3), 0.0, math.log(1e-3)], [0.0, 0.0, 1.0, 0.0]))
            if best is None or fit.cost < best.cost:
                best = fit
    assert best is not None                           # four fits ran
    eff = eff_of(best.x)
    assert eff.decode_compute is not None             # eff_of fits it
    pred = predict(points, acc, arch, tp, eff)
    return {
        "accelerator": accelerator, "model": model, "tp": tp,
        "efficiency": {"compute": round(eff.compute, 4), "decode_compute": round(eff.decode_compute, 4),
                       "memory": round(eff.memory, 4),
                       "step_overhead_ms": round(eff.step_overhead_s * 1e3, 3)},
        "rms_log_error": round(float(np.sqrt(np.mean(residual(best.x) ** 2))), 4),
        "points": [{"phase": p.phase.slug, "batch_size": p.batch_size, "tokens": p.tokens, "measured_tok_s": p.tokens_per_s,
                    "model_tok_s": round(float(q), 2)} for p, q in zip(points, pred)],
    }
