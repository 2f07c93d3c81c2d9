"""Profile refreshes and time-series samples of a simulation run.

Every ``refresh_s`` the telemetry window closes and the driver rebuilds its profiles from
the aggregates (as the live profile builder does from ClickHouse). Every ``sample_s`` one
row of the time series is recorded: completed tokens per second, in-flight and backlog, per
pool utilization (busy engine time / alive instances), queue and running requests, the
tokens placed on the pool per phase, and per tenant the tokens released and the requests
still waiting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from phaseroute.sim.events import REFRESH, SAMPLE

if TYPE_CHECKING:
    from phaseroute.sim.host import SimHost


class Sampling:
    """Mixin of ``Simulator``: refresh and sample handlers."""

    def _on_refresh(self: SimHost, _a: object, _b: object) -> None:
        for pool in self.pools:
            for inst in pool.instances:
                if inst.alive and inst.tau:
                    inst.advance(self.now, self.tel)
        self.tel.roll(self.now)
        self.driver.refresh(self.now)
        self._speculate()
        self.push(self.now + self.cfg.refresh_s, REFRESH)

    def _on_sample(self: SimHost, _a: object, _b: object) -> None:
        dt = self.now - self.last_sample
        if dt <= 0:
            return
        row: dict[str, Any] = {"t": round(self.now, 3), "tokens_per_s": (self.tokens_done - self.last_sample_tokens) / dt,
                               "inflight": self.inflight, "backlog": self.driver.backlog(), "pools": {}}
        for pool in self.pools:
            busy = 0.0
            for inst in pool.instances:
                if inst.alive and inst.tau:
                    inst.advance(self.now, self.tel)
                busy += inst.busy_s
            n = pool.alive_instances
            row["pools"][pool.spec.name] = {
                "util": (busy - pool.busy_mark) / (n * dt) if n else 0.0, "alive": n,
                "queued": len(pool.q_pre) + len(pool.q_dec), "running": pool.running,
                "routed_prefill_tokens": pool.routed_pre, "routed_decode_tokens": pool.routed_dec,
            }
            pool.busy_mark = busy
            pool.routed_pre = pool.routed_dec = 0
        row["tenants"] = {t.name: {"released_tokens": self.tenant_released[k] - self.tenant_mark[k],
                                   "waiting": self.tenant_waiting[k]} for k, t in enumerate(self.w.tenants)}
        self.tenant_mark = list(self.tenant_released)
        self.series.append(row)
        self.last_sample, self.last_sample_tokens = self.now, self.tokens_done
        if self.unresolved_jobs > 0:
            self.push(self.now + self.sample_s, SAMPLE)

