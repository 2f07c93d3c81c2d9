"""Deterministic ids and keys carried in the messages, built in one place so every service
(and a replay of it) computes the same value."""

from __future__ import annotations

import hashlib
import re
import unicodedata

PHASES = ("prefill", "decode")


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


_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
CUSTOM_ID_MAX = 512


def job_id_problem(job_id: object) -> str | None:
    """Why ``job_id`` cannot be a job id, or None. Job ids name blob keys and Kafka keys, so
    they are 1-128 characters of letters, digits, '.', '_' and '-', starting with a letter or digit."""
    if not isinstance(job_id, str) or not _JOB_ID.match(job_id):
        return (f"job id {job_id!r} must be 1-128 characters of letters, digits, '.', '_' and '-', "
                "starting with a letter or digit")
    return None


def custom_id_problem(custom_id: object) -> str | None:
    """Why ``custom_id`` cannot be a request's custom id, or None: a string of 1-512
    characters without control characters."""
    if not isinstance(custom_id, str) or not custom_id:
        return f"custom_id must be a non-empty string, got {custom_id!r}"
    if len(custom_id) > CUSTOM_ID_MAX:
        return f"custom_id {custom_id[:40]!r}... is {len(custom_id)} characters; at most {CUSTOM_ID_MAX}"
    if any(unicodedata.category(ch) == "Cc" for ch in custom_id):
        return f"custom_id {custom_id!r} contains control characters"
    return None
