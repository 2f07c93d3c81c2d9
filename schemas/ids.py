"""Deterministic ids and keys carried in the messages, built in one place so every service
(and a replay of it) computes the same value."""

from __future__ import annotations

import hashlib

PHASES = ("prefill", "decode")
CANARY_TENANT = "_canary"  # the reserved tenant of the drift monitor's canaries
ID_MAX_LENGTH = 128
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")
CUSTOM_ID_MAX_LENGTH = 512


def job_id_problem(job_id: object) -> str | None:
    """None for a usable job id, else what is wrong with it. A job id names files, keys and
    topics' records, so it is 1-128 characters of ``[A-Za-z0-9._:-]``, not starting with a dot
    (no path can be made of it)."""
    if not isinstance(job_id, str) or not job_id:
        return f"job_id must be a non-empty string, got {job_id!r}"
    if len(job_id) > ID_MAX_LENGTH:
        return f"job_id must be at most {ID_MAX_LENGTH} characters, got {len(job_id)} ({job_id[:40]!r}...)"
    bad = sorted(set(job_id) - _ID_CHARS)
    if bad or job_id.startswith("."):
        shown = "".join(bad)[:10] or "."
        return f"job_id {job_id[:80]!r} may hold only letters, digits and . _ : - (and not start with '.'); found {shown!r}"
    return None


def custom_id_problem(custom_id: object) -> str | None:
    """None for a usable custom id (any printable text up to 512 characters), else what is wrong."""
    if not isinstance(custom_id, str) or not custom_id:
        return f"custom_id must be a non-empty string, got {custom_id!r}"
    if len(custom_id) > CUSTOM_ID_MAX_LENGTH:
        return f"custom_id must be at most {CUSTOM_ID_MAX_LENGTH} characters, got {len(custom_id)}"
    if not custom_id.isprintable():
        return f"custom_id {custom_id[:80]!r} holds control characters"
    return None


def request_id(job_id: str, custom_id: str) -> str:
    """32 hex digits from (job_id, custom_id): same inputs, same id; unambiguous for any strings."""
    job, custom = job_id.encode("utf-8"), custom_id.encode("utf-8")
    framed = b"".join((len(job).to_bytes(8, "little"), job, len(custom).to_bytes(8, "little"), custom))
    return hashlib.blake2b(framed, digest_size=16).hexdigest()


def attempt_id(request: str, phase: str, attempt: int) -> str:
    """``<request_id>/<phase>/<attempt>``, the id of one try of one phase of a request."""
    if phase not in PHASES:
        raise ValueError(f"attempt phase {phase!r} is not one of {PHASES}")
    if attempt < 0:
        raise ValueError(f"attempt number {attempt} is negative")
    return f"{request}/{phase}/{attempt}"


def job_event_id(job_id: str, kind: str, seq: int = 0) -> str:
    """``<job_id>/<kind>/<seq>``: seq is 0 for state changes and, for PROGRESS, the number of
    finished requests (done + failed) the event reports, so a replay repeats the same ids."""
    return f"{job_id}/{str(kind).lower()}/{seq}"


def profile_key(model: str, phase: str, pool: str, variant: str, source_pool: str | None = None) -> str:
    """Key of the compacted ``profiles`` topic: ``model|phase|pool|variant[|source_pool]``."""
    parts = [model, str(phase), pool, variant] + ([source_pool] if source_pool else [])
    bad = [p for p in parts if "|" in p]
    if bad:
        raise ValueError(f"profile key parts must not contain '|': {bad}")
    return "|".join(parts)
