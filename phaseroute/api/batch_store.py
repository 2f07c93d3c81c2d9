"""Batches of one tenant in the blob store: the create request as accepted, and idempotency.

``tenants/<t>/batches/<batch_id>.json`` holds what the job's events do not: the endpoint,
the completion window, the metadata, the input file id, the creation time, and a cancel
request's time. Batch ids are ``batch_<11 hex digits of the creation time in ms><12 random
hex>`` (they are the job ids), so sorted ids are in creation order.

Idempotency (the SDK retries a POST that timed out, without a key of its own):
- with an ``Idempotency-Key`` header, the first create with that key wins for ``KEY_TTL_S``;
  a retry gets the same batch, and the same key with other parameters is a 400;
- without one, an identical create (same tenant and body) within ``DEDUP_WINDOW_S`` returns
  the batch already made.
Both claims are ``put_if_absent`` records under ``tenants/<t>/idempotency/``, written before
the job is published, so a batch is published at most once per claim.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any

from phaseroute.infra.blobstore import (
    BlobNotFoundError,
    BlobStore,
    batch_key,
    tenant_prefix,
)

_ID = re.compile(r"^batch_[0-9a-f]{23}$")
DEDUP_WINDOW_S = 600.0
KEY_TTL_S = 24 * 3600.0


def valid_batch_id(batch_id: str) -> bool:
    return bool(_ID.match(batch_id))


def body_hash(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class BatchStore:
    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def put(self, record: dict[str, Any]) -> None:
        self.store.put(batch_key(record["tenant"], record["id"]), json.dumps(record).encode())

    def get(self, tenant: str, batch_id: str) -> dict[str, Any] | None:
        if not valid_batch_id(batch_id):
            return None
        try:
            return dict(json.loads(self.store.get(batch_key(tenant, batch_id))))
        except BlobNotFoundError:
            return None

    def delete(self, tenant: str, batch_id: str) -> None:
        self.store.delete(batch_key(tenant, batch_id))

    def page(self, tenant: str, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        """Newest first, as OpenAI lists batches."""
        names = [k.rsplit("/", 1)[-1].removesuffix(".json") for k in self.store.list(tenant_prefix(tenant) + "batches/")]
        ids = sorted((n for n in names if valid_batch_id(n)), reverse=True)
        if after is not None:
            ids = [i for i in ids if i < after]
        out: list[dict[str, Any]] = []
        for batch_id in ids:
            record = self.get(tenant, batch_id)
            if record is None:
                continue
            if len(out) == limit:
                return out, True
            out.append(record)
        return out, False

    def claim(self, tenant: str, idempotency_key: str | None, body: dict[str, Any], batch_id: str,
              now: float | None = None) -> tuple[str, bool]:
        """(batch id, True if this call owns it). A held claim returns the batch it names;
        ValueError when the key was used with another body."""
        now = now if now is not None else time.time()
        digest = body_hash(body)
        if idempotency_key is not None:
            name, ttl = "key-" + hashlib.sha256(idempotency_key.encode()).hexdigest(), KEY_TTL_S
        else:
            name, ttl = "body-" + digest, DEDUP_WINDOW_S
        key = f"{tenant_prefix(tenant)}idempotency/{name}.json"
        record = {"batch_id": batch_id, "body": digest, "at": now}
        for _ in range(3):
            if self.store.put_if_absent(key, json.dumps(record).encode()):
                return batch_id, True
            try:
                held = json.loads(self.store.get(key))
            except BlobNotFoundError:
                continue
            if now - held["at"] > ttl:  # an old claim: this create starts a new batch
                self.store.delete(key)
                continue
            if held["body"] != digest:
                raise ValueError(f"Idempotency-Key {idempotency_key!r} was already used with other parameters")
            return held["batch_id"], False
        raise RuntimeError(f"could not claim idempotency record {key!r}")

    def release(self, tenant: str, idempotency_key: str | None, body: dict[str, Any]) -> None:
        """Drop a claim whose batch could not be published (so a retry tries again)."""
        name = ("key-" + hashlib.sha256(idempotency_key.encode()).hexdigest()) if idempotency_key else "body-" + body_hash(body)
        self.store.delete(f"{tenant_prefix(tenant)}idempotency/{name}.json")
