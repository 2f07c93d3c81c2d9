"""The blob store: every file a producer uploads and every output file, behind fsspec.

One setting, ``PHASEROUTE_BLOB_STORE_URL``, names the root: a local directory by default
(``<home>/blobs``), or any fsspec URL (``memory://phaseroute``, ``s3://bucket/prefix``,
``gs://...``) — the API, the control plane and the result sink of one deployment point at the
same root, so no path on one machine's disk ever crosses a topic: topics carry *keys*
relative to the root.

Keys are relative paths of ``[A-Za-z0-9._:=-]`` parts (job ids may hold ':'; no ``.``/``..``
part, no absolute path, no scheme), checked on every call, so a hostile key cannot leave the
root. Each tenant's
objects live under ``tenants/<tenant>/`` (see ``tenant_prefix``); the layout below is the only
one the services use:

    tenants/<t>/files/<file_id>            uploaded or produced file content
    tenants/<t>/files/<file_id>.meta.json  its file object (filename, bytes, purpose, ...)
    tenants/<t>/batches/<batch_id>.json    the batch as created (endpoint, window, metadata)
    tenants/<t>/outputs/<batch_id>/part-*.jsonl  result lines as the sink wrote them
    tenants/<t>/idempotency/<hash>.json    POST /v1/batches idempotency records
    tenants/<t>/spool/<batch_id>.prompts   rendered prompts of an admitted job (intake)

Writes are whole-object: ``put`` writes to a temporary name and renames it on a local
directory (fsync'd, so a crash never leaves half an object), and is a single PUT elsewhere.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import fsspec

_KEY_PART = re.compile(r"^[A-Za-z0-9._:=-]{1,200}$")
_TENANT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$")


class BlobKeyError(ValueError):
    """A key that is not a relative path inside the store."""


class BlobNotFoundError(FileNotFoundError):
    """No object under that key."""


def check_key(key: str) -> str:
    """``key`` if it is a relative path of safe parts; else BlobKeyError naming it."""
    if not isinstance(key, str) or not key or len(key) > 1000:
        raise BlobKeyError(f"blob key {key!r} must be a non-empty relative path of at most 1000 characters")
    parts = key.split("/")
    if any(p in (".", "..") or not _KEY_PART.match(p) for p in parts):
        raise BlobKeyError(f"blob key {key!r} must be a relative path of [A-Za-z0-9._:=-] parts without '.' or '..'")
    return key


def check_tenant(tenant: str) -> str:
    """Tenant names become a key part: letters, digits, '_' and '-', 1-64 characters."""
    if not isinstance(tenant, str) or not _TENANT.match(tenant):
        raise ValueError(f"tenant name {tenant!r} must match {_TENANT.pattern} (letters, digits, '_' and '-', 1-64 characters)")
    return tenant


def tenant_prefix(tenant: str) -> str:
    return f"tenants/{check_tenant(tenant)}/"


def file_key(tenant: str, file_id: str) -> str:
    return check_key(f"{tenant_prefix(tenant)}files/{file_id}")


def meta_key(tenant: str, file_id: str) -> str:
    return check_key(f"{tenant_prefix(tenant)}files/{file_id}.meta.json")


def batch_key(tenant: str, batch_id: str) -> str:
    return check_key(f"{tenant_prefix(tenant)}batches/{batch_id}.json")


def output_prefix(tenant: str, batch_id: str) -> str:
    return check_key(f"{tenant_prefix(tenant)}outputs/{batch_id}") + "/"


def spool_key(tenant: str, batch_id: str) -> str:
    return check_key(f"{tenant_prefix(tenant)}spool/{batch_id}.prompts")


class BlobStore:
    """Whole objects by key under one fsspec root."""

    def __init__(self, url: str) -> None:
        protocol, _, rest = url.partition("://")
        if not rest:  # a plain path
            protocol, rest = "file", url
        self.protocol = protocol
        self.fs: Any = fsspec.filesystem(protocol)
        if protocol == "file":
            rest = str(Path(rest).expanduser().resolve())
        self.root = rest.rstrip("/")
        self.url = f"{protocol}://{self.root}"
        if self.local:
            Path(self.root).mkdir(parents=True, exist_ok=True)

    @property
    def local(self) -> bool:
        return self.protocol == "file"

    def _path(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def put(self, key: str, data: bytes) -> None:
        """Write the whole object (atomic and fsync'd on a local directory)."""
        path = self._path(key)
        if not self.local:
            self.fs.pipe_file(path, data)
            return
        with self.writer(key) as fh:
            fh.write(data)

    @contextmanager
    def writer(self, key: str) -> Iterator[IO[bytes]]:
        """A binary file to stream an object into; it appears under ``key`` only when the block
        ends without an error (local: temp file + fsync + rename; elsewhere: one upload)."""
        path = self._path(key)
        if not self.local:
            with self.fs.open(path, "wb") as fh:
                yield fh
            return
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "wb") as fh:
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        dir_fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write unless the object exists; True if this call wrote it. Atomic on a local
        directory (link fails on an existing name); elsewhere check-then-put, which is enough for
        idempotency records whose competing writers write the same answer."""
        if not self.local:
            if self.exists(key):
                return False
            self.put(key, data)
            return True
        target = Path(self._path(key))
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, target)
            except FileExistsError:
                return False
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def get(self, key: str) -> bytes:
        try:
            return bytes(self.fs.cat_file(self._path(key)))
        except FileNotFoundError:
            raise BlobNotFoundError(f"no object {key!r} in the blob store {self.url}") from None

    @contextmanager
    def reader(self, key: str) -> Iterator[IO[bytes]]:
        """A binary stream of the object (read in chunks; never loaded whole)."""
        path = self._path(key)
        try:
            fh = self.fs.open(path, "rb")
        except FileNotFoundError:
            raise BlobNotFoundError(f"no object {key!r} in the blob store {self.url}") from None
        try:
            yield fh
        finally:
            fh.close()

    def exists(self, key: str) -> bool:
        return bool(self.fs.exists(self._path(key)))

    def size(self, key: str) -> int:
        try:
            return int(self.fs.size(self._path(key)))
        except FileNotFoundError:
            raise BlobNotFoundError(f"no object {key!r} in the blob store {self.url}") from None

    def list(self, prefix: str) -> list[str]:
        """Keys of the objects directly under ``prefix`` (a key ending in '/'), sorted."""
        base = self._path(prefix.rstrip("/"))
        try:
            entries = self.fs.ls(base, detail=True)
        except FileNotFoundError:
            return []
        keys = []
        for entry in entries:
            if entry.get("type") == "directory":
                continue
            name = str(entry["name"]).rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(".") and name.endswith(".tmp"):
                continue
            keys.append(prefix.rstrip("/") + "/" + name)
        return sorted(keys)

    def delete(self, key: str) -> bool:
        """Remove the object; False if it was not there."""
        try:
            self.fs.rm_file(self._path(key))
            return True
        except FileNotFoundError:
            return False


def open_blob_store(url: str) -> BlobStore:
    return BlobStore(url)
