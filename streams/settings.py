"""The control plane's configuration: policy configs plus per-tenant weights and quotas.

Tenants come from a YAML file (``phaseroute control --tenants FILE``)::

    acme:   {weight: 2, max_in_flight: 64, max_queued_tokens: 2000000, max_running_jobs: 10}
    globex: {weight: 1}

Unknown keys or bad values are errors naming the tenant, the key and the value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from phaseroute.streams.core import CoreConfig
from phaseroute.streams.model_catalog import ModelInfo
from phaseroute.streams.policy import FairConfig, ModelSpec, TenantQuota

TENANT_KEYS = {"weight", "max_in_flight", "max_queued_tokens", "max_running_jobs"}


def tenants_from(data: dict[str, Any]) -> tuple[FairConfig, dict[str, TenantQuota]]:
    weights, caps, quotas = {}, {}, {}
    for tenant, spec in (data or {}).items():
        spec = spec or {}
        unknown = set(spec) - TENANT_KEYS
        if unknown:
            raise ValueError(f"tenant {tenant!r}: unknown keys {sorted(unknown)} (known: {sorted(TENANT_KEYS)})")
        if "weight" in spec:
            if not isinstance(spec["weight"], (int, float)) or spec["weight"] <= 0:
                raise ValueError(f"tenant {tenant!r}: weight must be a positive number, got {spec['weight']!r}")
            weights[tenant] = float(spec["weight"])
        if "max_in_flight" in spec:
            caps[tenant] = int(spec["max_in_flight"])
        if "max_queued_tokens" in spec or "max_running_jobs" in spec:
            quotas[tenant] = TenantQuota(spec.get("max_queued_tokens"), spec.get("max_running_jobs"))
    return FairConfig(tenant_weights=weights, tenant_max_in_flight=caps), quotas


def core_config(models: dict[str, ModelInfo], tenants_file: Path | None = None, **overrides: Any) -> CoreConfig:
    """The control core's configuration for this deployment: its models and its tenants."""
    data = yaml.safe_load(tenants_file.read_text()) if tenants_file else {}
    fair, quotas = tenants_from(data)
    specs = {name: ModelSpec(name, info.context_tokens) for name, info in models.items()}
    return CoreConfig(models=specs, fair=fair, quotas=quotas, **overrides)
