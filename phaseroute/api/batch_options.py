"""What a batch create asks for, checked: the completion window as a deadline, and the
metadata keys phaseroute reads (pure; no I/O).

- ``completion_window``: ``24h`` as at OpenAI, or any other duration ``<number><s|m|h|d>``
  (``90s``, ``30m``, ``2h``, ``7d``) from ``MIN_WINDOW_S`` to ``MAX_WINDOW_S``; it is the job's deadline.
- metadata (at most 16 pairs, keys <= 64 characters, values <= 512, as at OpenAI), of which:
  ``priority`` an integer 0-9 (higher runs first within the tenant; default 0),
  ``quality_tier`` ``exact`` (default) or ``approximate``,
  ``quality_tolerance`` for ``approximate``: the accepted quality loss in [0, 1) (default: the platform's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from phaseroute.api.errors import ApiError

MIN_WINDOW_S = 60.0
MAX_WINDOW_S = 30 * 86400.0
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
METADATA_KEYS = ("priority", "quality_tier", "quality_tolerance")


@dataclass(frozen=True)
class BatchOptions:
    window_s: float
    priority: int
    quality_tier: str  # EXACT | APPROXIMATE (the Avro symbols)
    quality_tolerance: float | None


def window_seconds(window: str) -> float:
    match = _DURATION.match(window.strip())
    if not match:
        raise ApiError(400, f"completion_window {window!r} must be a duration such as 24h, 90s, 30m, 2h or 7d",
                       "invalid_completion_window", "completion_window")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
    if not MIN_WINDOW_S <= seconds <= MAX_WINDOW_S:
        raise ApiError(400, f"completion_window {window!r} is {seconds:.0f} s; it must be between {MIN_WINDOW_S:.0f} s "
                       f"and {MAX_WINDOW_S / 86400:.0f} days", "invalid_completion_window", "completion_window")
    return seconds


def check_metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    metadata = dict(metadata or {})
    if len(metadata) > 16:
        raise ApiError(400, f"metadata has {len(metadata)} pairs; at most 16", "invalid_metadata", "metadata")
    for key, value in metadata.items():
        if not key or len(key) > 64 or len(value) > 512:
            raise ApiError(400, f"metadata key {key[:70]!r}: keys are 1-64 characters and values at most 512",
                           "invalid_metadata", "metadata")
    return metadata


def batch_options(window: str, metadata: dict[str, str]) -> BatchOptions:
    priority_text = metadata.get("priority", "0")
    if not priority_text.isdigit() or not 0 <= int(priority_text) <= 9:
        raise ApiError(400, f"metadata.priority {priority_text!r} must be an integer from 0 to 9",
                       "invalid_metadata", "metadata.priority")
    tier = metadata.get("quality_tier", "exact").lower()
    if tier not in ("exact", "approximate"):
        raise ApiError(400, f"metadata.quality_tier {metadata['quality_tier']!r} must be exact or approximate",
                       "invalid_metadata", "metadata.quality_tier")
    tolerance: float | None = None
    if "quality_tolerance" in metadata:
        try:
            tolerance = float(metadata["quality_tolerance"])
        except ValueError:
            tolerance = -1.0
        if not 0.0 <= tolerance < 1.0:
            raise ApiError(400, f"metadata.quality_tolerance {metadata['quality_tolerance']!r} must be a number in [0, 1)",
                           "invalid_metadata", "metadata.quality_tolerance")
    return BatchOptions(window_seconds(window), int(priority_text), tier.upper(), tolerance)
