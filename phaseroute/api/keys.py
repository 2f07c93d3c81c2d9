"""API keys: made from 256 random bits, shown once, stored only as a hash.

A key looks like ``sk-pr-<43 url-safe characters>``. What the registry stores is
``sha256:<hex>`` of its bytes and a public ``key_id`` (the first 12 hex digits of that hash).
A fast hash is enough because the key is random (nothing to brute-force from a dictionary);
the presented key's hash is compared with ``hmac.compare_digest``, so the time a check takes
does not depend on how many leading characters were right.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_PREFIX = "sk-pr-"
KEY_ID_DIGITS = 12


def make_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_id_of(key_hash: str) -> str:
    return key_hash.removeprefix("sha256:")[:KEY_ID_DIGITS]


def same_hash(presented_hash: str, stored_hash: str) -> bool:
    """Constant-time equality of two key hashes."""
    return hmac.compare_digest(presented_hash.encode("ascii", "replace"), stored_hash.encode("ascii", "replace"))
