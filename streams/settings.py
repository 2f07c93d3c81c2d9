"""The control plane's configuration: policy configs plus per-tenant weights and quotas.

Weights and quotas come from the tenant registry (the compacted ``tenants`` topic, written by
``phaseroute tenants ...``) through ``tenant_config.tenant_settings``. The former YAML file
(``phaseroute control --tenants FILE``) still works, read into the same records::

    acme:   {weight: 2, max_in_flight: 64, max_queued_tokens: 2000000, max_running_jobs: 10}
    globex: {weight: 1}

(``phaseroute tenants import FILE`` writes such a file into the registry.) Unknown keys or bad
values are errors naming the tenant, the key and the value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from phaseroute.streams.core import CoreConfig
from phaseroute.streams.model_catalog import ModelInfo
from phaseroute.streams.policy import FairConfig, ModelSpec, TenantQuota
from phaseroute.streams.tenant_config import tenant_settings

TENANT_KEYS = {"weight", "max_in_flight", "max_queued_tokens", "max_running_jobs"}


def records_from_yaml(data: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Tenant records (without keys) of the YAML mapping."""
    records = []
    for tenant, spec in (data or {}).items():
        spec = spec or {}
        unknown = set(spec) - TENANT_KEYS
        if unknown:
            raise ValueError(f"tenant {tenant!r}: unknown keys {sorted(unknown)} (known: {sorted(TENANT_KEYS)})")
        records.append({"name": str(tenant), "weight": spec.get("weight", 1.0), "keys": [], "disabled": False,
                        "updated_at": 0, **{k: spec.get(k) for k in TENANT_KEYS - {"weight"}}})
    return records


def tenants_from(data: dict[str, Any]) -> tuple[FairConfig, dict[str, TenantQuota]]:
    return tenant_settings(records_from_yaml(data))


def core_config(models: dict[str, ModelInfo], tenants_file: Path | None = None,
                tenant_records: Iterable[Mapping[str, Any]] = (), **overrides: Any) -> CoreConfig:
    """The control core's configuration for this deployment: its models, and its tenants' weights,
    in-flight caps and quotas from the registry's records (plus a YAML file of them, if given)."""
    records = list(tenant_records)
    if tenants_file:
        records += records_from_yaml(yaml.safe_load(tenants_file.read_text()))
    fair, quotas = tenant_settings(records)
    specs = {name: ModelSpec(name, info.context_tokens) for name, info in models.items()}
    return CoreConfig(models=specs, fair=fair, quotas=quotas, **overrides)
