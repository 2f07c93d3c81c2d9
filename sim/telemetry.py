"""Simulated telemetry: what the live workers would write to ``telemetry.phase``, aggregated.

Every fluid segment of an instance (``steps`` engine steps of ``tau`` seconds with ``b``
decode tokens and ``c`` prompt tokens each) is one record. Records are summed per
(pool, phase, batch bucket) within a window; at each profile refresh the window closes and
``aggregates(now)`` returns exponentially time-decayed sums and step-latency quantiles over
the recent windows: the inputs the live profile builder reads from ClickHouse, handed to the
same ``build_profile_rows``. Buckets are powers of two of the decode batch, and of the
prompts per step for prefill (a chunk of c tokens of prompts of length l holds c / l prompts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PREFILL, DECODE = 0, 1
N_BUCKETS = 20          # 2^0 .. 2^19
LAT_BASE = math.log(1.05)

# per (pool, phase, bucket): [steps, tokens, seconds, batch sum, {latency bin: steps}]
PhaseSums = dict[tuple[int, int, int], list[Any]]
# per (src, dst) link: [transfers, bytes, service seconds, queue seconds]
LinkSums = dict[tuple[str, str], list[float]]


@dataclass(frozen=True)
class PhaseAggregate:
    """Decayed telemetry of one (pool, phase, batch bucket)."""

    pool: int
    phase: int
    bucket: int          # lower edge: 2 ** (bucket - 1) (bucket 0: unused)
    steps: float         # decayed number of engine steps
    tokens: float        # decayed tokens processed
    seconds: float       # decayed engine seconds
    batch_mean: float    # mean batch (decode requests, or prompts per prefill step)
    raw_steps: float     # undecayed steps (sample count)
    p50_s: float
    p90_s: float
    p99_s: float
    last_t: float        # end of the newest window holding data

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class LinkAggregate:
    src: str
    dst: str
    transfers: float
    bytes: float
    seconds: float       # service time (excluding queueing)
    queue_s: float
    last_t: float

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


class Telemetry:
    def __init__(self, n_pools: int, keep_windows: int = 30):
        self.n_pools = n_pools
        self.keep = keep_windows
        self.windows: list[tuple[float, PhaseSums, LinkSums]] = []   # (end time, phase sums, link sums)
        self._new_window()
        # fleet-lifetime totals for metrics
        self.total_tokens = [[0.0, 0.0] for _ in range(n_pools)]

    def _new_window(self) -> None:
        self.cur: PhaseSums = {}
        self.cur_links: LinkSums = {}

    def record(self, pool: int, b: int, c: float, steps: float, tau: float, l_pre: int) -> None:
        lat_bin = int(math.log(tau) / LAT_BASE) if tau > 0 else 0
        if b:
            self._add((pool, DECODE, b.bit_length()), steps, b * steps, tau * steps, b * steps, lat_bin)
            self.total_tokens[pool][DECODE] += b * steps
        if c:
            prompts = c / l_pre if l_pre else 1.0      # prompts per step (chunks span prompts)
            if prompts < 1.0:
                prompts = 1.0
            self._add((pool, PREFILL, int(prompts).bit_length()), steps, c * steps, tau * steps, prompts * steps, lat_bin)
            self.total_tokens[pool][PREFILL] += c * steps

    def _add(self, key: tuple[int, int, int], steps: float, tokens: float, seconds: float, batch_sum: float,
             lat_bin: int) -> None:
        acc = self.cur.get(key)
        if acc is None:
            acc = self.cur[key] = [0.0, 0.0, 0.0, 0.0, {}]
        acc[0] += steps
        acc[1] += tokens
        acc[2] += seconds
        acc[3] += batch_sum
        hist = acc[4]
        hist[lat_bin] = hist.get(lat_bin, 0.0) + steps

    def record_transfer(self, src: str, dst: str, nbytes: float, service_s: float, queue_s: float) -> None:
        acc = self.cur_links.get((src, dst))
        if acc is None:
            acc = self.cur_links[(src, dst)] = [0.0, 0.0, 0.0, 0.0]
        acc[0] += 1
        acc[1] += nbytes
        acc[2] += service_s
        acc[3] += queue_s

    def roll(self, now: float) -> None:
        """Close the current window (called at every profile refresh)."""
        self.windows.append((now, self.cur, self.cur_links))
        del self.windows[: max(0, len(self.windows) - self.keep)]
        self._new_window()

    def aggregates(self, now: float, half_life_s: float) -> tuple[list[PhaseAggregate], list[LinkAggregate]]:
        lam = math.log(2) / half_life_s
        phase: dict[tuple[int, int, int], list[Any]] = {}   # decayed sums + [raw steps, {bin: steps}, last_t]
        links: dict[tuple[str, str], list[float]] = {}
        for end, sums, lsums in self.windows:
            w = math.exp(-lam * max(now - end, 0.0))
            for key, (steps, tokens, secs, bsum, hist) in sums.items():
                a = phase.setdefault(key, [0.0, 0.0, 0.0, 0.0, 0.0, {}, end])
                a[0] += w * steps
                a[1] += w * tokens
                a[2] += w * secs
                a[3] += w * bsum
                a[4] += steps
                for k, n in hist.items():
                    a[5][k] = a[5].get(k, 0.0) + w * n
                a[6] = end
            for lkey, (n, nbytes, secs, qs) in lsums.items():
                a = links.setdefault(lkey, [0.0, 0.0, 0.0, 0.0, end])
                a[0] += w * n
                a[1] += w * nbytes
                a[2] += w * secs
                a[3] += w * qs
                a[4] = end
        out = []
        for (pool, ph, bucket), (steps, tokens, secs, bsum, raw, hist, last) in sorted(phase.items()):
            if steps <= 0:
                continue
            p50, p90, p99 = _quantiles(hist, (0.5, 0.9, 0.99))
            out.append(PhaseAggregate(pool, ph, bucket, steps, tokens, secs, bsum / steps, raw, p50, p90, p99, last))
        lout = [LinkAggregate(s, d, n, nb, secs, qs, last) for (s, d), (n, nb, secs, qs, last) in sorted(links.items())]
        return out, lout


def _quantiles(hist: dict[int, float], qs: tuple[float, ...]) -> list[float]:
    total = sum(hist.values())
    out, acc, keys = [], 0.0, sorted(hist)
    i = 0
    for q in qs:
        while i < len(keys) and acc + hist[keys[i]] < q * total:
            acc += hist[keys[i]]
            i += 1
        k = keys[min(i, len(keys) - 1)]
        out.append(math.exp((k + 0.5) * LAT_BASE))
    return out
