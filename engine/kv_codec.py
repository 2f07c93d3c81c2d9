"""KV blob codec: a request's prompt KV as one self-checking byte string.

Layout (version 1, little-endian)::

    b"PRKV" | u16 layout_version | u32 header_len | header (UTF-8 JSON of KVMeta + payload_bytes,
    space-padded so the payload starts at a multiple of 64 bytes)
    | payload: for each layer, K then V, each [kv_heads, tokens, head_dim] in the KV dtype, C order
    | u32 CRC-32 of each of those 2 x layers tensors
    | u32 CRC-32 of prefix + header + that CRC array (so of the whole blob, transitively)

The payload is exactly ``layers x 2 x kv_heads x head_dim x dtype_bytes x tokens`` bytes; the rest
is ~300 + 8 x layers bytes of metadata. Per-tensor CRCs let two threads checksum a large blob
(zlib releases the GIL). ``decode`` checks magic, version, header, the exact total length, the
trailer CRC and every tensor CRC before it builds a single tensor; any failure raises
``KVIntegrityError`` (retryable: re-run the prefill). Decoded tensors are zero-copy views of the
blob (read-only buffers included: the tensors are only ever read).
"""

from __future__ import annotations

import json
import mmap
import struct
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import Any

import torch

from phaseroute.engine.errors import KVIntegrityError
from phaseroute.engine.protocol import KV_LAYOUT_VERSION, KVCache, KVMeta

MAGIC = b"PRKV"
_PREFIX = struct.Struct("<4sHI")
_CRC = struct.Struct("<I")
PAYLOAD_ALIGN = 64
PARALLEL_CRC_BYTES = 4 << 20


def encoded_size(meta: KVMeta) -> int:
    """Total blob bytes for ``meta`` (payload formula + header + CRCs)."""
    return _PREFIX.size + len(_header(meta)) + meta.payload_bytes + _CRC.size * (2 * meta.num_layers + 1)


def encode_parts(kv: KVCache) -> list[Any]:
    """The blob as a list of buffers, without copying contiguous CPU tensors (stores write them in turn).

    ``parts[-1]`` is the 4-byte trailer CRC (see ``parts_checksum``).
    """
    meta = kv.meta
    header = _header(meta)
    head = _PREFIX.pack(MAGIC, meta.layout_version, len(header)) + header
    dtype = getattr(torch, meta.dtype)
    shape = (meta.kv_heads, meta.prompt_len, meta.head_dim)
    if len(kv.keys) != meta.num_layers or len(kv.values) != meta.num_layers:
        raise ValueError(f"KV has {len(kv.keys)}/{len(kv.values)} key/value layers, meta says {meta.num_layers}")
    payload = []
    for k, v in zip(kv.keys, kv.values):
        for tensor in (k, v):
            if tuple(tensor.shape) != shape or tensor.dtype != dtype:
                raise ValueError(f"KV tensor {tuple(tensor.shape)} {tensor.dtype} does not match meta {shape} {dtype}")
            payload.append(tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy())
    crcs = struct.pack(f"<{len(payload)}I", *_crc_each(payload))
    return [head, *payload, crcs, _CRC.pack(zlib.crc32(crcs, zlib.crc32(head)))]


def parts_size(parts: list[Any]) -> int:
    """Total bytes of ``encode_parts`` output (the stored blob size)."""
    return sum(memoryview(p).nbytes for p in parts)


def parts_checksum(parts: list[Any]) -> str:
    """The blob's checksum as ``"crc32:<8 hex digits>"``: the trailer CRC (its last 4 bytes,
    little-endian), which covers the header and every tensor's CRC, hence the whole blob."""
    return f"crc32:{_CRC.unpack(bytes(parts[-1]))[0]:08x}"


def encode(kv: KVCache) -> bytes:
    """Serialize ``kv`` (tensors on any device) into one blob."""
    return b"".join(encode_parts(kv))


def decode(blob: bytes | bytearray | memoryview | mmap.mmap, device: str = "cpu") -> KVCache:
    """Verify and deserialize a blob; ``KVIntegrityError`` names what is wrong."""
    view = memoryview(blob).cast("B") if memoryview(blob).format != "B" else memoryview(blob)
    if len(view) < _PREFIX.size + _CRC.size:
        raise KVIntegrityError(f"KV blob is {len(view)} bytes, shorter than the {_PREFIX.size + _CRC.size}-byte frame")
    magic, version, header_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise KVIntegrityError(f"KV blob starts with {bytes(magic)!r}, not {MAGIC!r}")
    if version != KV_LAYOUT_VERSION:
        raise KVIntegrityError(f"KV blob layout version {version} is not the supported {KV_LAYOUT_VERSION}")
    meta = _parse_header(view, header_len)
    start = _PREFIX.size + header_len
    count = 2 * meta.num_layers
    end = start + meta.payload_bytes  # the CRC array starts here
    if len(view) != end + _CRC.size * (count + 1):
        raise KVIntegrityError(
            f"KV blob for request {meta.request_id!r} is {len(view)} bytes, expected {end + _CRC.size * (count + 1)} "
            f"({meta.prompt_len} tokens x {meta.bytes_per_token} bytes + framing): truncated or padded"
        )
    crcs = view[end : end + _CRC.size * count]
    (stored,) = _CRC.unpack_from(view, len(view) - _CRC.size)
    if zlib.crc32(crcs, zlib.crc32(view[:start])) != stored:
        raise KVIntegrityError(f"KV blob for request {meta.request_id!r}: header/CRC-table checksum mismatch")
    step = meta.payload_bytes // count if count else 0
    tensors = [view[start + i * step : start + (i + 1) * step] for i in range(count)]
    for i, (want, got) in enumerate(zip(struct.unpack(f"<{count}I", crcs), _crc_each(tensors))):
        if want != got:
            raise KVIntegrityError(
                f"KV blob for request {meta.request_id!r}: layer {i // 2} {'KV'[i % 2]} fails its CRC-32 "
                f"({got:#010x} != stored {want:#010x})"
            )
    return _tensors(view, start, meta, device)


def _crc_each(buffers: list[Any]) -> list[int]:
    """CRC-32 of each buffer, on two threads when there is enough to share (zlib drops the GIL)."""
    if sum(memoryview(b).nbytes for b in buffers) < PARALLEL_CRC_BYTES:
        return [zlib.crc32(b) for b in buffers]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(zlib.crc32, buffers))


def _tensors(view: memoryview, start: int, meta: KVMeta, device: str) -> KVCache:
    dtype = getattr(torch, meta.dtype)
    shape = (meta.kv_heads, meta.prompt_len, meta.head_dim)
    step = meta.payload_bytes // (2 * meta.num_layers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only buffers: the tensors are only ever read
        raw = torch.frombuffer(view, dtype=torch.uint8) if len(view) else torch.empty(0, dtype=torch.uint8)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
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
        shape_bytes = meta.payload_bytes
        if min(meta.prompt_len, meta.num_layers, meta.kv_heads, meta.head_dim) < 1:
            raise ValueError("sizes must be >= 1")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise KVIntegrityError(f"KV blob header ({header_len} bytes) is not valid KV metadata: {exc}") from None
    if shape_bytes != payload:
        raise KVIntegrityError(f"KV blob header says {payload} payload bytes, its shape says {shape_bytes}")
    return meta
