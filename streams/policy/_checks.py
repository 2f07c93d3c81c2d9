"""Validation helpers for the policy's configuration and data objects.

Every helper raises ``ValueError`` with a message that names the owner, the field and the
bad value (``RouterConfig.exploration_share must be in [0, 1], got 1.5``), so a bad setting
fails where it is made, not deep inside a decision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def _fail(owner: str, name: str, rule: str, value: object) -> None:
    raise ValueError(f"{owner}.{name} must be {rule}, got {value!r}")


def finite(owner: str, name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        _fail(owner, name, "a finite number", value)


def positive(owner: str, name: str, value: float, *, allow_inf: bool = False) -> None:
    if allow_inf and value == math.inf:
        return
    finite(owner, name, value)
    if value <= 0:
        _fail(owner, name, "> 0", value)


def non_negative(owner: str, name: str, value: float) -> None:
    finite(owner, name, value)
    if value < 0:
        _fail(owner, name, ">= 0", value)


def fraction(owner: str, name: str, value: float) -> None:
    finite(owner, name, value)
    if not 0.0 <= value <= 1.0:
        _fail(owner, name, "in [0, 1]", value)


def at_least(owner: str, name: str, value: float, low: float) -> None:
    finite(owner, name, value)
    if value < low:
        _fail(owner, name, f">= {low}", value)


def positive_mapping(owner: str, name: str, values: Mapping[str, float]) -> None:
    for key, value in values.items():
        positive(owner, f"{name}[{key!r}]", value)


def non_empty(owner: str, name: str, value: str) -> None:
    if not isinstance(value, str) or not value.strip():
        _fail(owner, name, "a non-empty string", value)
