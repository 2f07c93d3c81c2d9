"""KV blob stores behind one interface: a local/shared directory (default) or any fsspec URL.

``put(key, blob) -> location`` writes a blob and returns a URL that any process can hand to
``get(location)`` (the location travels in the ``kv.ready`` event). Keys are relative paths
such as ``"<request_id>/<attempt>"``; a replayed attempt overwrites its own blob. Writes are
atomic on the directory store (temp file + rename), so a reader never sees half a blob; the
codec's checksum catches everything else. ``open_store(url)`` picks the backend:
``None``/a path/``file://`` -> ``DirKVStore``; any other scheme (``memory://``, ``s3://``...) ->
``FsspecKVStore``.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from phaseroute.engine.errors import KVNotFoundError

SUFFIX = ".kv"
Blob = bytes | bytearray | memoryview | Sequence[Any]  # one buffer, or kv_codec.encode_parts()
_KEY = re.compile(r"^[A-Za-z0-9._=-]+(/[A-Za-z0-9._=-]+)*$")


@runtime_checkable
class KVStore(Protocol):
    url: str

    def put(self, key: str, blob: Blob) -> str: ...
    def get(self, location: str) -> bytes | mmap.mmap: ...  # bytes-like, read-only
    def delete(self, location: str) -> None: ...
    def exists(self, location: str) -> bool: ...


def check_key(key: str) -> str:
    """Keys are relative paths of [A-Za-z0-9._=-] parts; no '..', no absolute paths."""
    if not _KEY.match(key) or any(part in (".", "..") for part in key.split("/")):
        raise ValueError(f"KV key {key!r} must be a relative path of [A-Za-z0-9._=-] parts without '.' or '..'")
    return key


class DirKVStore:
    """Blobs as files under a directory (local disk or a shared mount)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(str(root).removeprefix("file://")).resolve()
        self.url = f"file://{self.root}"

    def put(self, key: str, blob: Blob) -> str:
        path = self.root / (check_key(key) + SUFFIX)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            for part in _parts(blob):
                f.write(part)
        os.replace(tmp, path)
        return f"file://{path}"

    def get(self, location: str) -> bytes | mmap.mmap:
        """The blob, memory-mapped read-only (no copy; pages pre-faulted). Writers never truncate a
        blob in place (temp file + rename), so the mapping stays valid even if the key is replaced."""
        try:
            with open(self._path(location), "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    return b""
                return mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ)
        except FileNotFoundError:
            raise KVNotFoundError(f"no KV blob at {location!r}") from None

    def delete(self, location: str) -> None:
        self._path(location).unlink(missing_ok=True)

    def exists(self, location: str) -> bool:
        return self._path(location).is_file()

    def _path(self, location: str) -> Path:
        path = Path(location.removeprefix("file://")).resolve()
        if not path.is_relative_to(self.root):
            raise KVNotFoundError(f"KV location {location!r} is outside store {self.url!r}")
        return path


class FsspecKVStore:
    """Blobs in any fsspec filesystem (``memory://`` in tests, object stores in production)."""

    def __init__(self, url: str) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.url)
        self.protocol = url.split("://", 1)[0]

    def put(self, key: str, blob: Blob) -> str:
        location = f"{self.url}/{check_key(key)}{SUFFIX}"
        self.fs.pipe_file(self._path(location), b"".join(_parts(blob)))
        return location

    def get(self, location: str) -> bytes:
        try:
            blob: bytes = self.fs.cat_file(self._path(location))
            return blob
        except FileNotFoundError:
            raise KVNotFoundError(f"no KV blob at {location!r}") from None

    def delete(self, location: str) -> None:
        if self.exists(location):
            self.fs.rm_file(self._path(location))

    def exists(self, location: str) -> bool:
        return bool(self.fs.exists(self._path(location)))

    def _path(self, location: str) -> str:
        if not location.startswith(self.url + "/"):
            raise KVNotFoundError(f"KV location {location!r} is outside store {self.url!r}")
        return f"{self.root}/{location[len(self.url) + 1:]}"


def _parts(blob: Blob) -> Sequence[Any]:
    return [blob] if isinstance(blob, (bytes, bytearray, memoryview)) else blob


def open_store(url: str | None = None) -> DirKVStore | FsspecKVStore:
    """The store for ``url`` (default: ``settings().kv_store``, a directory under home)."""
    if url is None:
        from phaseroute.config import settings

        url = settings().kv_store
    if "://" in url and not url.startswith("file://"):
        return FsspecKVStore(url)
    return DirKVStore(url)
