"""Every message kind's Avro schema, current and past, found by kind or by fingerprint.

Layout (package data of ``phaseroute.schemas``):

- ``avro/<kind>.avsc``: the current schema of a kind (what writers write, what readers read into);
- ``avro/history/<kind>.v<N>.avsc``: earlier versions that were ever shipped. The current
  schema is version (highest N in history) + 1. To change a schema, first copy the current file
  to ``history/<kind>.v<N>.avsc``, then edit it; every added field needs a default so that
  both old-writer/new-reader and new-writer/old-reader resolve.

Each version is identified by the CRC-64-AVRO (Rabin) fingerprint of its Parsing Canonical
Form, as Avro single-object encoding requires. The canonical form drops docs, defaults and
logical types, so editing a doc does not make a new version.

Timestamps are ``long`` with logicalType ``timestamp-millis`` in the .avsc files (for other
tools), but phaseroute reads and writes them as plain ints (epoch milliseconds): the schema
given to fastavro has the logical types stripped, which leaves the fingerprint unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, cast

from fastavro import parse_schema
from fastavro.schema import fingerprint as _fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form

from phaseroute.schemas.errors import SchemaLoadError, UnknownKindError

NAMESPACE = "phaseroute"
MAGIC = b"\xc3\x01"
HEADER_LEN = len(MAGIC) + 8
_HISTORY_NAME = re.compile(r"^(?P<kind>[a-z][a-z0-9_]*)\.v(?P<version>[1-9][0-9]*)\.avsc$")
_KIND_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def rabin_fingerprint(canonical_form: str) -> int:
    """CRC-64-AVRO fingerprint of a Parsing Canonical Form, as an unsigned 64-bit int."""
    little_endian_hex = _fastavro_fingerprint(canonical_form, "CRC-64-AVRO")
    return int.from_bytes(bytes.fromhex(little_endian_hex), "little")


def record_name(kind: str) -> str:
    """The Avro record name of a kind: job_submitted -> JobSubmitted."""
    return "".join(part.capitalize() for part in kind.split("_"))


@dataclass(frozen=True, eq=False)
class SchemaVersion:
    """One version of one kind's schema, ready for fastavro."""

    kind: str
    version: int
    fingerprint: int
    canonical: str
    source: dict[str, Any]  # the .avsc JSON as written (docs, defaults, logical types)
    parsed: dict[str, Any]  # fastavro-parsed, logical types stripped (ints stay ints)
    origin: str  # where it was loaded from, for messages

    @property
    def header(self) -> bytes:
        """Single-object encoding header: 0xC3 0x01 + 8-byte little-endian fingerprint."""
        return MAGIC + self.fingerprint.to_bytes(8, "little")

    @property
    def fingerprint_hex(self) -> str:
        return f"0x{self.fingerprint:016x}"

    def field_names(self) -> list[str]:
        return [field["name"] for field in self.source["fields"]]

    def __repr__(self) -> str:
        return f"SchemaVersion({self.kind} v{self.version} {self.fingerprint_hex} from {self.origin})"


def load_version(kind: str, version: int, source: dict[str, Any], origin: str) -> SchemaVersion:
    """Check that `source` is the record schema of `kind` and prepare it for fastavro."""
    if not _KIND_NAME.match(kind):
        raise SchemaLoadError(f"{origin}: kind {kind!r} is not snake_case")
    expected = f"{NAMESPACE}.{record_name(kind)}"
    actual = f"{source.get('namespace', '')}.{source.get('name', '')}"
    if source.get("type") != "record" or actual != expected:
        raise SchemaLoadError(f"{origin}: expected a record named {expected}, found {source.get('type')} {actual}")
    try:
        parsed = cast(dict[str, Any], parse_schema(_strip_logical_types(source), named_schemas={}))  # a record: a dict
        canonical = to_parsing_canonical_form(source)
    except Exception as exc:  # fastavro raises several types for a bad schema
        raise SchemaLoadError(f"{origin}: not a valid Avro schema: {type(exc).__name__}: {exc}") from exc
    return SchemaVersion(kind, version, rabin_fingerprint(canonical), canonical, source, parsed, origin)


def _strip_logical_types(node: Any) -> Any:
    """A deep copy of a schema without logicalType annotations (so fastavro keeps ints)."""
    if isinstance(node, list):
        return [_strip_logical_types(item) for item in node]
    if isinstance(node, dict):
        return {key: _strip_logical_types(value) for key, value in node.items() if key != "logicalType"}
    return node


class Registry:
    """Immutable: the current (reader and writer) schema per kind, plus every other known
    writer version (shipped history, or schemas learned later), each found by fingerprint."""

    def __init__(self, current: Iterable[SchemaVersion], writers: Iterable[SchemaVersion] = ()) -> None:
        self._current: dict[str, SchemaVersion] = {}
        for version in current:
            if version.kind in self._current:
                raise SchemaLoadError(f"{version.origin} and {self._current[version.kind].origin} are both current {version.kind}")
            self._current[version.kind] = version
        self._kinds = tuple(sorted(self._current))
        self._all: list[SchemaVersion] = []
        self._by_fingerprint: dict[int, SchemaVersion] = {}
        for version in sorted([*self._current.values(), *writers], key=lambda v: (v.kind, v.version)):
            self._add(version)

    def _add(self, version: SchemaVersion) -> None:
        if version.kind not in self._current:
            raise SchemaLoadError(f"{version.origin}: no current schema of kind {version.kind}")
        same = [v for v in self._all if v.kind == version.kind and v.version == version.version]
        if same and same[0].fingerprint != version.fingerprint:
            raise SchemaLoadError(f"{version.origin} and {same[0].origin} are both {version.kind} v{version.version}")
        clash = self._by_fingerprint.get(version.fingerprint)
        if clash is not None and clash.kind != version.kind:
            raise SchemaLoadError(f"{version.origin} has the fingerprint of {clash.origin}")
        if not same:
            self._all.append(version)
        if clash is None or clash is not self._current[version.kind]:
            # The current schema wins a shared fingerprint (doc-only edits keep it): no resolution step.
            self._by_fingerprint[version.fingerprint] = version

    @classmethod
    def from_package(cls) -> Registry:
        """The schemas shipped in ``phaseroute.schemas`` (avro/ and avro/history/)."""
        return cls(*_load_tree(resources.files("phaseroute.schemas") / "avro"))

    @classmethod
    def from_directory(cls, path: str | Path) -> Registry:
        """Schemas from a directory laid out like ``avro/`` (tests, tools)."""
        return cls(*_load_tree(Path(path)))

    def extended(self, writers: Iterable[SchemaVersion]) -> Registry:
        """A registry that can also read bytes written with `writers` (for example a newer
        release's schemas); the current schemas stay the same."""
        return Registry(self._current.values(), [*self._all, *writers])

    def kinds(self) -> tuple[str, ...]:
        return self._kinds

    def current(self, kind: str) -> SchemaVersion:
        """The current schema of `kind`; UnknownKindError names the known kinds."""
        try:
            return self._current[kind]
        except KeyError:
            raise UnknownKindError(kind, self._kinds) from None

    def by_fingerprint(self, fingerprint: int) -> SchemaVersion | None:
        return self._by_fingerprint.get(fingerprint)

    def versions(self, kind: str | None = None) -> list[SchemaVersion]:
        """All versions, oldest first, of one kind or of every kind."""
        if kind is not None:
            self.current(kind)
        return [v for v in self._all if kind is None or v.kind == kind]

    def __iter__(self) -> Iterator[SchemaVersion]:
        return iter(self._all)


def _load_tree(root: Traversable | Path) -> tuple[list[SchemaVersion], list[SchemaVersion]]:
    if not root.is_dir():
        raise SchemaLoadError(f"schema directory {root} does not exist")
    history_dir = root / "history"
    history: list[SchemaVersion] = []
    if history_dir.is_dir():
        for entry in sorted(history_dir.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".avsc"):
                match = _HISTORY_NAME.match(entry.name)
                if not match:
                    raise SchemaLoadError(f"{entry}: history files are named <kind>.v<N>.avsc")
                history.append(load_version(match["kind"], int(match["version"]), _read_json(entry), str(entry)))
    latest: dict[str, int] = {}
    for version in history:
        latest[version.kind] = max(latest.get(version.kind, 0), version.version)
    current = []
    for entry in sorted(root.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".avsc"):
            kind = entry.name[: -len(".avsc")]
            current.append(load_version(kind, latest.get(kind, 0) + 1, _read_json(entry), str(entry)))
    orphans = set(latest) - {v.kind for v in current}
    if orphans:
        raise SchemaLoadError(f"{history_dir} has versions of {sorted(orphans)} but {root} has no current schema for them")
    if not current:
        raise SchemaLoadError(f"no .avsc files in {root}")
    return current, history


def _read_json(entry: Traversable | Path) -> dict[str, Any]:
    try:
        source = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SchemaLoadError(f"{entry}: cannot read JSON: {exc}") from exc
    if not isinstance(source, dict):
        raise SchemaLoadError(f"{entry}: expected a JSON object (an Avro record schema), got {type(source).__name__}")
    return source


@lru_cache(maxsize=1)
def default_registry() -> Registry:
    """The shipped schemas, loaded once per process."""
    return Registry.from_package()
