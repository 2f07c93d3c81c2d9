"""Tenant records (the compacted ``tenants`` topic) -> the fair scheduler's and admission's
per-tenant settings. Pure: records in, configs out; no I/O, no clock.

The tenant registry is the one place weights and quotas come from: the control plane follows
the topic and calls ``tenant_settings`` whenever it changes. A disabled tenant keeps its
weight (work already admitted still finishes fairly) and gets a zero running-jobs quota, so
nothing new of it is admitted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from phaseroute.streams.policy import FairConfig, TenantQuota


def tenant_settings(records: Iterable[Mapping[str, Any]], base: FairConfig | None = None
                    ) -> tuple[FairConfig, dict[str, TenantQuota]]:
    """``FairConfig`` (weights, in-flight caps) and ``TenantQuota`` per tenant from ``tenant``
    records; the latest record per name wins (by ``updated_at``). A bad value is a ValueError
    naming the tenant, the field and the value."""
    latest: dict[str, Mapping[str, Any]] = {}
    for record in records:
        name = record["name"]
        if name not in latest or latest[name]["updated_at"] <= record["updated_at"]:
            latest[name] = record
    weights: dict[str, float] = {}
    caps: dict[str, int] = {}
    quotas: dict[str, TenantQuota] = {}
    for name, record in sorted(latest.items()):
        weight = record.get("weight", 1.0)
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not weight > 0:
            raise ValueError(f"tenant {name!r}: weight must be a positive number, got {weight!r}")
        weights[name] = float(weight)
        cap = record.get("max_in_flight")
        if cap is not None:
            caps[name] = _positive_int(name, "max_in_flight", cap)
        tokens, jobs = record.get("max_queued_tokens"), record.get("max_running_jobs")
        if record.get("disabled"):
            jobs = 0
        elif jobs is not None:
            jobs = _positive_int(name, "max_running_jobs", jobs)
        if tokens is not None:
            tokens = _positive_int(name, "max_queued_tokens", tokens)
        if tokens is not None or jobs is not None:
            quotas[name] = TenantQuota(tokens, jobs)
    fair = replace(base or FairConfig(), tenant_weights=weights, tenant_max_in_flight=caps)
    return fair, quotas


def _positive_int(tenant: str, key: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"tenant {tenant!r}: {key} must be a positive integer, got {value!r}")
    return value
