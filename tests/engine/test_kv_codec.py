"""KV codec: exact size formula, round trip, and every kind of damage detected before decoding."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from phaseroute.engine import kv_codec
from phaseroute.engine.errors import EngineError, KVIntegrityError
from phaseroute.engine.protocol import KVCache, KVMeta


def make_kv(tokens: int = 7, dtype: str = "float32", layers: int = 3, heads: int = 2, dim: int = 8) -> KVCache:
    gen = torch.Generator().manual_seed(tokens)
    shape = (heads, tokens, dim)
    keys = [torch.randn(shape, generator=gen).to(getattr(torch, dtype)) for _ in range(layers)]
    values = [torch.randn(shape, generator=gen).to(getattr(torch, dtype)) for _ in range(layers)]
    return KVCache(keys, values, KVMeta("tiny-llama", dtype, tokens, 42, layers, heads, dim, request_id="r1"))


@pytest.mark.parametrize("dtype,elem", [("float32", 4), ("bfloat16", 2)])
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_round_trip_and_exact_size(dtype: str, elem: int, tokens: int) -> None:
    kv = make_kv(tokens, dtype)
    blob = kv_codec.encode(kv)
    formula = 3 * 2 * 2 * 8 * elem * tokens  # layers x 2 x kv_heads x head_dim x bytes x tokens
    assert kv.meta.payload_bytes == formula
    assert formula < len(blob) <= formula + 512  # small metadata only
    assert len(blob) == kv_codec.encoded_size(kv.meta)
    out = kv_codec.decode(blob)
    assert out.meta == kv.meta
    for a, b in zip(kv.keys + kv.values, out.keys + out.values):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_parts_equal_joined_blob_and_report_size_and_checksum() -> None:
    kv = make_kv(11)
    parts = kv_codec.encode_parts(kv)
    blob = kv_codec.encode(kv)
    assert b"".join(parts) == blob
    assert kv_codec.parts_size(parts) == len(blob)
    assert kv_codec.parts_checksum(parts) == f"crc32:{int.from_bytes(blob[-4:], 'little'):08x}"


def test_noncontiguous_views_encode_like_copies() -> None:
    big = torch.randn(2, 10, 8)
    kv = KVCache([big[:, :7]] * 3, [big[:, 2:9]] * 3, KVMeta("m", "float32", 7, 1, 3, 2, 8))
    out = kv_codec.decode(kv_codec.encode(kv))
    assert torch.equal(out.keys[0], big[:, :7]) and torch.equal(out.values[2], big[:, 2:9])


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b[:-1], id="truncated-by-one"),
        pytest.param(lambda b: b[: len(b) // 2], id="truncated-half"),
        pytest.param(lambda b: b[:3], id="shorter-than-frame"),
        pytest.param(lambda b: b + b"\0", id="extra-byte"),
        pytest.param(lambda b: _flip(b, len(b) // 2), id="payload-bit-flip"),
        pytest.param(lambda b: _flip(b, 20), id="header-bit-flip"),
        pytest.param(lambda b: _flip(b, 0), id="magic"),
        pytest.param(lambda b: _flip(b, len(b) - 1), id="checksum"),
        pytest.param(lambda b: b"", id="empty"),
    ],
)
def test_damaged_blob_is_refused_as_retryable_integrity_error(damage) -> None:
    blob = kv_codec.encode(make_kv(9))
    with pytest.raises(KVIntegrityError) as info:
        kv_codec.decode(damage(bytes(blob)))
    assert info.value.retryable and isinstance(info.value, EngineError)


def test_header_that_lies_about_its_shape_is_refused() -> None:
    """A well-formed frame whose header disagrees with its payload (re-checksummed) is still refused."""
    kv = make_kv(5)
    liar = dataclasses.replace(kv.meta, prompt_len=6)
    head = kv_codec._header(liar)
    body = bytes(kv_codec.encode(kv))
    start = kv_codec._PREFIX.size + len(kv_codec._header(kv.meta))
    forged = kv_codec._PREFIX.pack(kv_codec.MAGIC, 1, len(head)) + head + body[start:-4]
    forged += kv_codec._CRC.pack(__import__("zlib").crc32(forged))
    with pytest.raises(KVIntegrityError, match="expected"):
        kv_codec.decode(forged)


def test_shape_mismatch_on_encode_names_the_shapes() -> None:
    kv = make_kv(4)
    kv.keys[1] = kv.keys[1][:, :3]
    with pytest.raises(ValueError, match=r"\(2, 3, 8\)"):
        kv_codec.encode(kv)


def _flip(blob: bytes, index: int) -> bytes:
    out = bytearray(blob)
    out[index] ^= 0x01
    return bytes(out)
