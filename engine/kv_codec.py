"""KV blob codec: a request's prompt KV as one self-checking byte string.

Layout (version 1, little-endian)::

    b"PRKV" | u16 layout_version | u32 header_len | header (UTF-8 JSON of KVMeta + payload_bytes,
    space-padded so the payload starts at a multiple of 64 bytes)
    | payload: for each layer, K then V, each [kv_heads, tokens, head_dim] in the KV dtype, C order
    | u32 CRC-32 of everything before it

The payload is exactly ``layers x 2 x kv_heads x head_dim x dtype_bytes x tokens`` bytes; the rest
is ~300 bytes of metadata. ``decode`` verifies the checksum, then magic, version, header and the
exact total length, before it builds a single tensor; any failure raises ``KVIntegrityError`` (retryable:
re-run the prefill). Decoded tensors are zero-copy views of the blob when it is writable.
"""

from __future__ import annotations

import json
import struct
import warnings
import zlib
from dataclasses import asdict
from typing import Any

import torch

from phaseroute.engine.errors import KVIntegrityError
from phaseroute.engine.protocol import KV_LAYOUT_VERSION, KVCache, KVMeta

MAGIC = b"PRKV"
_PREFIX = struct.Struct("<4sHI")
_CRC = struct.Struct("<I")
PAYLOAD_ALIGN = 64


def encoded_size(meta: KVMeta) -> int:
    """Total blob bytes for ``meta`` (payload formula + header + framing)."""
    return _PREFIX.size + len(_header(meta)) + meta.payload_bytes + _CRC.size


def encode_parts(kv: KVCache) -> list[Any]:
    """The blob as a list of buffers, without copying contiguous CPU tensors (stores write them in turn)."""
    meta = kv.meta
    header = _header(meta)
    head = _PREFIX.pack(MAGIC, meta.layout_version, len(header)) + header
    parts: list[Any] = [head]
    crc = zlib.crc32(head)
    dtype = getattr(torch, meta.dtype)
    shape = (meta.kv_heads, meta.prompt_len, meta.head_dim)
    if len(kv.keys) != meta.num_layers or len(kv.values) != meta.num_layers:
        raise ValueError(f"KV has {len(kv.keys)}/{len(kv.values)} key/value layers, meta says {meta.num_layers}")
    for k, v in zip(kv.keys, kv.values):
        for tensor in (k, v):
            if tuple(tensor.shape) != shape or tensor.dtype != dtype:
                raise ValueError(f"KV tensor {tuple(tensor.shape)} {tensor.dtype} does not match meta {shape} {dtype}")
            raw = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
            crc = zlib.crc32(raw, crc)
            parts.append(raw)
    parts.append(_CRC.pack(crc))
    return parts


def parts_size(parts: list[Any]) -> int:
    """Total bytes of ``encode_parts`` output (the stored blob size)."""
    return sum(memoryview(p).nbytes for p in parts)


def parts_checksum(parts: list[Any]) -> str:
    """The blob's checksum as ``"crc32:<8 hex digits>"`` (its last 4 bytes, little-endian)."""
    return f"crc32:{_CRC.unpack(bytes(parts[-1]))[0]:08x}"


def encode(kv: KVCache) -> bytes:
    """Serialize ``kv`` (tensors on any device) into one blob."""
    return b"".join(encode_parts(kv))


def decode(blob: bytes | bytearray | memoryview, device: str = "cpu") -> KVCache:
    """Verify and deserialize a blob; ``KVIntegrityError`` names what is wrong."""
    view = memoryview(blob)
    if len(view) < _PREFIX.size + _CRC.size:
        raise KVIntegrityError(f"KV blob is {len(view)} bytes, shorter than the {_PREFIX.size + _CRC.size}-byte frame")
    (stored,) = _CRC.unpack_from(view, len(view) - _CRC.size)
    actual = zlib.crc32(view[: len(view) - _CRC.size])
    if stored != actual:
        raise KVIntegrityError(
            f"KV blob of {len(view)} bytes fails its CRC-32 ({actual:#010x} != stored {stored:#010x}): corrupted or truncated"
        )
    magic, version, header_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise KVIntegrityError(f"KV blob starts with {bytes(magic)!r}, not {MAGIC!r}")
    if version != KV_LAYOUT_VERSION:
        raise KVIntegrityError(f"KV blob layout version {version} is not the supported {KV_LAYOUT_VERSION}")
    meta = _parse_header(view, header_len)
    start = _PREFIX.size + header_len
    expected = start + meta.payload_bytes + _CRC.size
    if len(view) != expected:
        raise KVIntegrityError(
            f"KV blob for request {meta.request_id!r} is {len(view)} bytes, expected {expected} "
            f"({meta.prompt_len} tokens x {meta.bytes_per_token} bytes + framing)"
        )
    return _tensors(view, start, meta, device)


def _tensors(view: memoryview, start: int, meta: KVMeta, device: str) -> KVCache:
    dtype = getattr(torch, meta.dtype)
    shape = (meta.kv_heads, meta.prompt_len, meta.head_dim)
    step = meta.payload_bytes // (2 * meta.num_layers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only buffers: the tensors are only ever read
        raw = torch.frombuffer(view, dtype=torch.uint8) if len(view) else torch.empty(0, dtype=torch.uint8)
    keys, values = [], []
    offset = start
    for _ in range(meta.num_layers):
        for out in (keys, values):
            out.append(raw[offset : offset + step].view(dtype).view(shape).to(device))
            offset += step
    return KVCache(keys, values, meta)


def _header(meta: KVMeta) -> bytes:
    fields: dict[str, Any] = asdict(meta)
    fields["payload_bytes"] = meta.payload_bytes
    text = json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()
    pad = -(_PREFIX.size + len(text)) % PAYLOAD_ALIGN  # the payload starts aligned for any dtype
    return text + b" " * pad


def _parse_header(view: memoryview, header_len: int) -> KVMeta:
    raw = view[_PREFIX.size : _PREFIX.size + header_len]
    try:
        fields = json.loads(bytes(raw))
        payload = fields.pop("payload_bytes")
        meta = KVMeta(**fields)
    except (ValueError, TypeError, KeyError) as exc:
        raise KVIntegrityError(f"KV blob header ({header_len} bytes) is not valid KV metadata: {exc}") from None
    if meta.payload_bytes != payload:
        raise KVIntegrityError(f"KV blob header says {payload} payload bytes, its shape says {meta.payload_bytes}")
    return meta
