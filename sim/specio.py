"""Reading YAML/JSON specs and checking their fields with errors that name file and field.

A spec argument may be a path, the name of a bundled example (``azure-code`` finds
``sim/data/workload-azure-code.yaml``), or an already-parsed dict.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from phaseroute.schemas.enums import Phase
from phaseroute.sim.errors import SpecError

DATA_DIR = Path(str(resources.files("phaseroute.sim") / "data"))


def bundled(kind: str) -> list[str]:
    """Names of the bundled example specs of one kind (``workload`` or ``fleet``)."""
    return sorted(p.stem[len(kind) + 1:] for p in DATA_DIR.glob(f"{kind}-*.yaml"))


def resolve_spec_path(ref: str | Path, kind: str) -> Path:
    """A spec file from a path or a bundled example name; SpecError lists what was tried."""
    path = Path(ref)
    if path.is_file():
        return path
    candidate = DATA_DIR / f"{kind}-{ref}.yaml"
    if candidate.is_file():
        return candidate
    raise SpecError(
        f"{kind} spec {str(ref)!r}: no such file, and no bundled {kind} of that name "
        f"(bundled: {', '.join(bundled(kind)) or 'none'})"
    )


def load_spec(ref: str | Path | dict[str, Any], kind: str) -> tuple[dict[str, Any], Path | None]:
    """Parse a spec: returns (mapping, file it came from or None for an inline dict)."""
    if isinstance(ref, dict):
        return ref, None
    path = resolve_spec_path(ref, kind)
    text = path.read_text()
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SpecError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a {kind} spec must be a mapping at the top level, got {type(data).__name__}")
    return data, path


def _as_number(value: Any) -> Any:
    """YAML 1.1 reads ``8e9`` (no sign after e) as a string: accept numeric strings."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


PHASE_SLUGS = [p.slug for p in Phase]   # how spec files spell a phase: prefill, decode


def _phase_of_slug(value: Any, fail: Callable[[str], SpecError]) -> Phase:
    for phase in Phase:
        if value == phase.slug:
            return phase
    raise fail(f"must be one of {PHASE_SLUGS}, got {value!r}")


class Fields:
    """Typed access to one mapping of a spec; every error names ``where`` and the field."""

    def __init__(self, data: Any, where: str):
        if not isinstance(data, dict):
            raise SpecError(f"{where}: expected a mapping, got {data!r}")
        self.data, self.where = data, where

    def _fail(self, key: str, msg: str) -> SpecError:
        return SpecError(f"{self.where}: field {key!r} {msg}")

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = ...) -> Any:
        if key not in self.data:
            if default is ...:
                raise self._fail(key, "is required")
            return default
        return self.data[key]

    def phase(self, key: str, default: Any = ...) -> Phase:
        """A phase written as its slug (``prefill`` / ``decode``, the spec files' spelling)."""
        return _phase_of_slug(self.raw(key, default), lambda msg: self._fail(key, msg))

    def phases(self, key: str, default: Any = ...) -> tuple[Phase, ...]:
        """A non-empty list of distinct phase slugs, in the spec's order."""
        value = self.raw(key, default)
        if not isinstance(value, list) or not value:
            raise self._fail(key, f"must be a non-empty list of {PHASE_SLUGS}, got {value!r}")
        out = tuple(_phase_of_slug(v, lambda msg: self._fail(key, msg)) for v in value)
        if len(set(out)) != len(out):
            raise self._fail(key, f"lists a phase twice: {value!r}")
        return out

    def num(self, key: str, default: Any = ..., lo: float | None = None, hi: float | None = None,
            strict_lo: bool = False) -> float:
        value = _as_number(self.raw(key, default))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise self._fail(key, f"must be a number, got {value!r}")
        if lo is not None and (value < lo or (strict_lo and value == lo)):
            raise self._fail(key, f"must be {'>' if strict_lo else '>='} {lo}, got {value!r}")
        if hi is not None and value > hi:
            raise self._fail(key, f"must be <= {hi}, got {value!r}")
        return float(value)

    def int(self, key: str, default: Any = ..., lo: int | None = None) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._fail(key, f"must be an integer, got {value!r}")
        if lo is not None and value < lo:
            raise self._fail(key, f"must be >= {lo}, got {value!r}")
        return value

    # ``str`` names this method from here to the end of the class: annotations there spell ``builtins.str``
    def str(self, key: str, default: Any = ..., choices: tuple[str, ...] | None = None) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str):
            raise self._fail(key, f"must be a string, got {value!r}")
        if choices and value not in choices:
            raise self._fail(key, f"must be one of {list(choices)}, got {value!r}")
        return value

    def range(self, key: builtins.str, default: Any = ..., lo: float = 0.0) -> tuple[float, float]:
        """A [min, max] pair or a single number (min = max)."""
        value = self.raw(key, default)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value, value]
        if (not isinstance(value, (list, tuple)) or len(value) != 2
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)):
            raise self._fail(key, f"must be a number or a [min, max] pair, got {value!r}")
        a, b = float(value[0]), float(value[1])
        if a < lo or b < a:
            raise self._fail(key, f"must satisfy {lo} <= min <= max, got {value!r}")
        return a, b

    def sub(self, key: builtins.str, default: Any = ...) -> Fields:
        value = self.raw(key, default)
        return Fields(value if value is not None else {}, f"{self.where}.{key}")

    def unknown(self, allowed: set[builtins.str]) -> None:
        extra = sorted(set(self.data) - allowed)
        if extra:
            raise SpecError(f"{self.where}: unknown field(s) {extra}; allowed: {sorted(allowed)}")
