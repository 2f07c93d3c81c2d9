"""The tenant registry: the compacted ``tenants`` topic, read and written.

``TenantRegistry`` follows the topic in a background thread (every API process has its own,
so the API stays stateless) and answers ``authenticate(key) -> tenant name | None``: the key's
hash is looked up by its public key id and compared in constant time; a revoked key or a
disabled tenant is refused. A key added or revoked is seen by every API process as soon as
its follower reads the record (well under a second on a live cluster).

The operator functions (``add_tenant``, ``add_key``, ``revoke``, ``update``, ``import_yaml``)
read the current records, change one, and publish it whole (the topic keeps the latest per
tenant). They are what ``phaseroute tenants ...`` calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from phaseroute.api.kafka_io import QUIET_CLIENT, publish, read_latest
from phaseroute.api.keys import hash_key, key_id_of, make_key, same_hash
from phaseroute.infra import topics
from phaseroute.infra.blobstore import check_tenant

TOPIC = topics.TENANTS
QUOTA_FIELDS = ("max_in_flight", "max_queued_tokens", "max_running_jobs")


def _newer(candidate: dict[str, Any], held: dict[str, Any]) -> bool:
    return bool(candidate["updated_at"] >= held["updated_at"])


def read_tenants(bootstrap: str) -> dict[str, dict[str, Any]]:
    """Every tenant's latest record, by name."""
    return read_latest(bootstrap, TOPIC, "tenant", lambda r: r["name"], _newer)


@dataclass(frozen=True)
class _KeyEntry:
    tenant: str
    key_hash: str
    valid: bool


class TenantRegistry:
    """The live tenant table of one API process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tenants: dict[str, dict[str, Any]] = {}
        self._by_key_id: dict[str, _KeyEntry] = {}
        self._follower: Any = None

    def on_record(self, record: dict[str, Any]) -> None:
        with self._lock:
            held = self._tenants.get(record["name"])
            if held is not None and not _newer(record, held):
                return
            self._tenants[record["name"]] = record
            self._by_key_id = {k: e for k, e in self._by_key_id.items() if e.tenant != record["name"]}
            for key in record.get("keys") or []:
                valid = key.get("revoked_at") is None and not record.get("disabled")
                self._by_key_id[key["key_id"]] = _KeyEntry(record["name"], key["key_hash"], valid)

    def authenticate(self, key: str) -> str | None:
        """The tenant owning ``key``, or None (unknown, revoked, or tenant disabled)."""
        presented = hash_key(key)
        with self._lock:
            entry = self._by_key_id.get(key_id_of(presented))
        stored = entry.key_hash if entry is not None else "sha256:" + "0" * 64
        matches = same_hash(presented, stored)  # the same work whether or not the id was known
        return entry.tenant if entry is not None and matches and entry.valid else None

    def tenant(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._tenants.get(name)

    def start(self, bootstrap: str, wait_s: float = 15.0) -> None:
        from phaseroute.infra.topic_follower import TopicFollower

        self._follower = TopicFollower(bootstrap, TOPIC, "tenant", self.on_record, service="api-registry",
                                       settings=QUIET_CLIENT)
        self._follower.start()
        self._follower.caught_up.wait(wait_s)

    def stop(self) -> None:
        if self._follower is not None:
            self._follower.stop()


# -- operator commands ------------------------------------------------------------------------
def _now_ms() -> int:
    return int(time.time() * 1000)


def new_tenant_record(name: str, weight: float = 1.0, quotas: Mapping[str, int | None] | None = None,
                      now_ms: int | None = None) -> dict[str, Any]:
    check_tenant(name)
    if name.startswith("_"):
        raise ValueError(f"tenant name {name!r}: names starting with '_' are reserved (the platform's own work)")
    if not weight > 0:
        raise ValueError(f"tenant {name!r}: weight must be > 0, got {weight!r}")
    record: dict[str, Any] = {"name": name, "weight": float(weight), "keys": [], "disabled": False,
                              "updated_at": now_ms if now_ms is not None else _now_ms()}
    for field in QUOTA_FIELDS:
        value = (quotas or {}).get(field)
        if value is not None and value < 1:
            raise ValueError(f"tenant {name!r}: {field} must be >= 1, got {value!r}")
        record[field] = value
    return record


def with_new_key(record: dict[str, Any], now_ms: int | None = None) -> tuple[dict[str, Any], str]:
    """The record with one more key, and that key (to show once)."""
    key = make_key()
    key_hash = hash_key(key)
    now = now_ms if now_ms is not None else _now_ms()
    entry = {"key_id": key_id_of(key_hash), "key_hash": key_hash, "created_at": now, "revoked_at": None}
    return dict(record, keys=list(record.get("keys") or []) + [entry], updated_at=now), key


def with_revoked(record: dict[str, Any], key_id: str | None, now_ms: int | None = None) -> dict[str, Any]:
    """The record with ``key_id`` (or, for None, every key) revoked; an unknown id is an error."""
    now = now_ms if now_ms is not None else _now_ms()
    ids = [k["key_id"] for k in record.get("keys") or []]
    if key_id is not None and key_id not in ids:
        raise ValueError(f"tenant {record['name']!r} has no key {key_id!r}; its keys are {ids}")
    keys = [dict(k, revoked_at=k.get("revoked_at") or now) if key_id in (None, k["key_id"]) else k
            for k in record.get("keys") or []]
    return dict(record, keys=keys, updated_at=now)


def save(bootstrap: str, record: dict[str, Any]) -> None:
    publish(bootstrap, [(TOPIC, record["name"], "tenant", record)])


def add_tenant(bootstrap: str, name: str, weight: float, quotas: Mapping[str, int | None]) -> tuple[dict[str, Any], str]:
    """Register a new tenant with one key; returns (record, key). An existing name is an error."""
    if name in read_tenants(bootstrap):
        raise ValueError(f"tenant {name!r} already exists; `phaseroute tenants key {name}` makes another key")
    record, key = with_new_key(new_tenant_record(name, weight, quotas))
    save(bootstrap, record)
    return record, key


def existing(bootstrap: str, name: str) -> dict[str, Any]:
    tenants = read_tenants(bootstrap)
    if name not in tenants:
        raise ValueError(f"no tenant {name!r}; known: {sorted(tenants) or 'none'} (`phaseroute tenants add NAME`)")
    return tenants[name]


def import_yaml(bootstrap: str, data: Mapping[str, Any]) -> list[str]:
    """Tenants of a YAML mapping ``{name: {weight, max_in_flight, max_queued_tokens,
    max_running_jobs}}`` (the former ``control --tenants`` file) written to the registry,
    keeping the keys of tenants that exist. Returns the names written."""
    known = read_tenants(bootstrap)
    records = []
    for name, spec in (data or {}).items():
        spec = dict(spec or {})
        unknown = set(spec) - {"weight", *QUOTA_FIELDS}
        if unknown:
            raise ValueError(f"tenant {name!r}: unknown keys {sorted(unknown)} (known: weight, {', '.join(QUOTA_FIELDS)})")
        record = new_tenant_record(str(name), float(spec.get("weight", 1.0)), {f: spec.get(f) for f in QUOTA_FIELDS})
        if name in known:
            record = dict(record, keys=known[name].get("keys") or [], disabled=known[name].get("disabled", False))
        records.append(record)
    publish(bootstrap, [(TOPIC, r["name"], "tenant", r) for r in records])
    return [r["name"] for r in records]
