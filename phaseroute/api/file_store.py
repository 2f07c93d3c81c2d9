"""Files of one tenant in the blob store: upload, describe, list, read, delete.

Content lives at ``tenants/<t>/files/<id>`` and the file object beside it at
``<id>.meta.json``. Ids are ``file-<11 hex digits of the creation time in ms><12 random hex>``,
so sorting ids sorts by creation time and listing needs no index. A file past its
``expires_at`` is gone: reads answer 404 and it is deleted on the way.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator
from typing import IO, Any

from phaseroute.infra.blobstore import (
    BlobNotFoundError,
    BlobStore,
    file_key,
    meta_key,
    tenant_prefix,
)

_ID = re.compile(r"^file-[0-9a-f]{23}$")
META_SUFFIX = ".meta.json"
CHUNK = 1 << 20


class FileTooLarge(ValueError):
    pass


def new_id(prefix: str, now_ms: int) -> str:
    return f"{prefix}{now_ms:011x}{secrets.token_hex(6)}"


def valid_file_id(file_id: str) -> bool:
    return bool(_ID.match(file_id))


class FileStore:
    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def save(self, tenant: str, source: IO[bytes], filename: str, purpose: str, max_bytes: int,
             expires_after_s: int | None = None, file_id: str | None = None, now: float | None = None) -> dict[str, Any]:
        """Stream ``source`` into the store (chunk by chunk) and write its file object."""
        now_ms = int((now if now is not None else time.time()) * 1000)
        file_id = file_id or new_id("file-", now_ms)
        size = 0
        with self.store.writer(file_key(tenant, file_id)) as out:
            while chunk := source.read(CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise FileTooLarge(f"the file is larger than {max_bytes} bytes, the most a batch input file may have")
                out.write(chunk)
        return self.write_meta(tenant, file_id, size, filename, purpose, now_ms // 1000,
                               now_ms // 1000 + expires_after_s if expires_after_s else None)

    def write_meta(self, tenant: str, file_id: str, size: int, filename: str, purpose: str, created_at: int,
                   expires_at: int | None = None) -> dict[str, Any]:
        meta = {"id": file_id, "object": "file", "bytes": size, "created_at": created_at,
                "filename": filename[:255] or "upload.jsonl", "purpose": purpose, "status": "processed",
                "expires_at": expires_at, "status_details": None}
        self.store.put(meta_key(tenant, file_id), json.dumps(meta).encode())
        return meta

    def get(self, tenant: str, file_id: str, now: float | None = None) -> dict[str, Any] | None:
        if not valid_file_id(file_id):
            return None
        try:
            meta = dict(json.loads(self.store.get(meta_key(tenant, file_id))))
        except BlobNotFoundError:
            return None
        if meta.get("expires_at") and meta["expires_at"] <= (now if now is not None else time.time()):
            self.delete(tenant, file_id)
            return None
        return meta

    def content(self, tenant: str, file_id: str) -> Iterator[bytes]:
        with self.store.reader(file_key(tenant, file_id)) as fh:
            while chunk := fh.read(CHUNK):
                yield chunk

    def delete(self, tenant: str, file_id: str) -> bool:
        had = self.store.delete(meta_key(tenant, file_id))
        self.store.delete(file_key(tenant, file_id))
        return had

    def ids(self, tenant: str, descending: bool) -> list[str]:
        names = [k.rsplit("/", 1)[-1] for k in self.store.list(tenant_prefix(tenant) + "files/")]
        ids = sorted({n[: -len(META_SUFFIX)] for n in names if n.endswith(META_SUFFIX)}, reverse=descending)
        return [i for i in ids if valid_file_id(i)]

    def page(self, tenant: str, after: str | None, limit: int, descending: bool, purpose: str | None
             ) -> tuple[list[dict[str, Any]], bool]:
        """Up to ``limit`` file objects after the cursor, and whether more follow."""
        ids = self.ids(tenant, descending)
        if after is not None:
            ids = [i for i in ids if (i < after if descending else i > after)]
        out: list[dict[str, Any]] = []
        for file_id in ids:
            meta = self.get(tenant, file_id)
            if meta is None or (purpose and meta["purpose"] != purpose):
                continue
            if len(out) == limit:
                return out, True
            out.append(meta)
        return out, False
