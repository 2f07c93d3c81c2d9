"""KV stores: directory and fsspec (memory://) behind one interface; another process reads the blob."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from phaseroute.engine import kv_codec
from phaseroute.engine.errors import KVIntegrityError, KVNotFoundError
from phaseroute.engine.kv_store import DirKVStore, FsspecKVStore, KVStore, open_store
from phaseroute.engine.protocol import KVCache, KVMeta


def small_kv(tokens: int = 5) -> KVCache:
    keys = [torch.full((2, tokens, 4), float(i)) for i in range(2)]
    values = [torch.full((2, tokens, 4), -float(i)) for i in range(2)]
    return KVCache(keys, values, KVMeta("tiny-llama", "float32", tokens, 3, 2, 2, 4, request_id="r"))


@pytest.fixture(params=["dir", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> KVStore:
    if request.param == "dir":
        return open_store(str(tmp_path / "kv"))
    return open_store(f"memory://kvtest-{uuid.uuid4().hex[:8]}")


def test_open_store_picks_backend(tmp_path: Path) -> None:
    assert isinstance(open_store(str(tmp_path)), DirKVStore)
    assert isinstance(open_store(f"file://{tmp_path}"), DirKVStore)
    assert isinstance(open_store("memory://x"), FsspecKVStore)


def test_put_get_delete_round_trip(store: KVStore) -> None:
    kv = small_kv()
    location = store.put("req-1/0", kv_codec.encode_parts(kv))
    assert location.startswith(store.url) and store.exists(location)
    out = kv_codec.decode(store.get(location))
    assert torch.equal(out.keys[1], kv.keys[1]) and out.meta == kv.meta
    # a replayed attempt overwrites its own key
    assert store.put("req-1/0", kv_codec.encode(small_kv(6))) == location
    assert kv_codec.decode(store.get(location)).meta.prompt_len == 6
    store.delete(location)
    assert not store.exists(location)
    with pytest.raises(KVNotFoundError):
        store.get(location)


def test_corrupted_stored_blob_raises_integrity_error(store: KVStore) -> None:
    location = store.put("bad", kv_codec.encode(small_kv()))
    blob = bytearray(store.get(location))
    blob[len(blob) // 2] ^= 0xFF
    store.put("bad", bytes(blob))
    with pytest.raises(KVIntegrityError):
        kv_codec.decode(store.get(location))


@pytest.mark.parametrize("key", ["../escape", "/abs", "a/../b", "", "sp ace", "a//b"])
def test_bad_keys_are_refused(store: KVStore, key: str) -> None:
    with pytest.raises(ValueError, match="KV key"):
        store.put(key, b"x")


def test_location_outside_store_is_refused(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "a"))
    with pytest.raises(KVNotFoundError, match="outside store"):
        store.get(f"file://{tmp_path}/b/x.kv")
    with pytest.raises(KVNotFoundError, match="outside store"):
        store.get("/etc/passwd")


def test_blob_written_by_one_process_is_read_by_another(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "kv"))
    location = store.put("cross/0", kv_codec.encode_parts(small_kv(8)))
    code = (
        "import sys, torch; from phaseroute.engine import kv_codec; from phaseroute.engine.kv_store import open_store\n"
        f"kv = kv_codec.decode(open_store({str(tmp_path / 'kv')!r}).get({location!r}))\n"
        "print(kv.meta.prompt_len, float(kv.keys[1].sum()), float(kv.values[1].sum()))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["8", str(float(2 * 8 * 4)), str(-float(2 * 8 * 4))]
