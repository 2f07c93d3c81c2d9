"""The .avsc files: loading, fingerprints, docs with units, shared types, shipped versions."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from fastavro import schemaless_reader, schemaless_writer
from fastavro.utils import generate_many

from phaseroute.schemas.errors import SchemaLoadError, UnknownKindError
from phaseroute.schemas.registry import Registry, default_registry, rabin_fingerprint

KINDS = {
    "job_submitted", "job_command", "job_event", "request", "prefill_work", "kv_ready",
    "decode_work", "result", "output_written", "phase_telemetry", "pool_heartbeat", "profile_row", "dead_letter", "attempt_failed",
    "drift_measurement", "quality_alert", "tenant", "job_admission", "load_snapshot",
}
LOCK = Path(__file__).with_name("shipped_fingerprints.json")


def _walk(schema: Any, path: str = ""):
    """Yield (path, node) for every record, enum and field in a schema."""
    if isinstance(schema, list):
        for branch in schema:
            yield from _walk(branch, path)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in ("record", "enum"):
            yield path or schema["name"], schema
        if kind == "record":
            for field in schema["fields"]:
                yield f"{path or schema['name']}.{field['name']}", field
                yield from _walk(field["type"], f"{path or schema['name']}.{field['name']}")
        elif kind == "array":
            yield from _walk(schema["items"], path + "[]")
        elif kind == "map":
            yield from _walk(schema["values"], path + "{}")


def test_every_kind_is_shipped_in_the_phaseroute_namespace() -> None:
    registry = default_registry()
    assert set(registry.kinds()) == KINDS
    for kind in KINDS:
        assert registry.current(kind).source["namespace"] == "phaseroute"


def test_fingerprint_is_crc64_avro_of_the_canonical_form() -> None:
    # Vectors of Avro's share/test/data/schema-tests.txt (signed there, unsigned here).
    vectors = {
        '"null"': 7195948357588979594,
        '"boolean"': -6970731678124411036,
        '{"name":"foo","type":"fixed","size":15}': 1756455273707447556,
        '{"name":"foo","type":"record","fields":[{"name":"f1","type":"boolean"}]}': 7843277075252814651,
    }
    for canonical, signed in vectors.items():
        assert rabin_fingerprint(canonical) == signed % 2**64, canonical
    schema = default_registry().current("job_command")
    assert schema.header[:2] == b"\xc3\x01"
    assert int.from_bytes(schema.header[2:], "little") == rabin_fingerprint(schema.canonical)


def test_unknown_kind_names_the_kind_and_the_known_ones() -> None:
    with pytest.raises(UnknownKindError) as info:
        default_registry().current("job_submited")
    assert "'job_submited'" in str(info.value) and "job_submitted" in str(info.value)


def test_every_record_enum_and_field_has_a_doc() -> None:
    missing = [
        f"{v.kind}: {path}"
        for v in default_registry()
        for path, node in _walk(v.source)
        if not str(node.get("doc", "")).strip()
    ]
    assert not missing, "add a doc to: " + ", ".join(missing)


UNIT_RULES = [
    (re.compile(r"(_s|_s_p\d+|_s_max)$"), "second"),  # seconds, or a rate "per second"
    (re.compile(r"(_at|^deadline|^earliest_feasible_deadline)$"), "epoch milliseconds"),
    (re.compile(r"bytes"), "bytes"),
    (re.compile(r"tokens"), "tokens"),
]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_docs_state_units(kind: str) -> None:
    bad = []
    for path, node in _walk(default_registry().current(kind).source):
        name = path.rsplit(".", 1)[-1]
        if "name" in node and "." in path and node.get("type") not in ("record", "enum"):
            for pattern, unit in UNIT_RULES:
                if pattern.search(name) and unit not in node["doc"]:
                    bad.append(f"{path} (doc must say {unit})")
    assert not bad, bad


def test_named_types_shared_between_kinds_are_identical() -> None:
    seen: dict[str, tuple[str, Any]] = {}
    for version in default_registry():
        for path, node in _walk(version.source):
            if node.get("type") in ("record", "enum") and "name" in node and path != version.source["name"]:
                name = node["name"]
                if name in seen:
                    other_kind, other = seen[name]
                    assert node == other, f"phaseroute.{name} differs between {other_kind} and {version.kind}"
                else:
                    seen[name] = (version.kind, node)
    assert {"Sampling", "QualityTier", "Phase"} <= seen.keys()


def test_every_shipped_version_reads_into_the_current_schema() -> None:
    """Random records of every history version resolve against the current reader schema."""
    registry = default_registry()
    for version in registry:
        current = registry.current(version.kind)
        for record in generate_many(version.parsed, 3):
            buffer = io.BytesIO()
            schemaless_writer(buffer, version.parsed, record)
            buffer.seek(0)
            schemaless_reader(buffer, version.parsed, current.parsed)


def test_shipped_versions_are_never_lost_or_edited_in_place() -> None:
    """tests/schemas/shipped_fingerprints.json lists every version ever shipped."""
    lock = json.loads(LOCK.read_text())
    have = {(v.kind, str(v.version)): v.fingerprint_hex for v in default_registry()}
    for kind, versions in lock.items():
        for number, fingerprint in versions.items():
            assert have.get((kind, number)) == fingerprint, (
                f"{kind} v{number} shipped with fingerprint {fingerprint} but now is {have.get((kind, number))}: "
                f"copy the shipped schema to schemas/avro/history/{kind}.v{number}.avsc and edit the current file "
                f"(only if v{number} never left a development branch, update {LOCK.name} instead)"
            )
    listed = {(k, n) for k, vs in lock.items() for n in vs}
    unlisted = {f"{k} v{n}": fp for (k, n), fp in sorted(have.items()) if (k, n) not in listed}
    assert not unlisted, f"new schema versions: add {unlisted} to {LOCK.name}"


def test_a_misnamed_schema_file_is_refused(tmp_path: Path) -> None:
    source = json.loads((Path(default_registry().current("job_command").origin)).read_text())
    (tmp_path / "job_order.avsc").write_text(json.dumps(source))
    with pytest.raises(SchemaLoadError, match="job_order.avsc: expected a record named phaseroute.JobOrder"):
        Registry.from_directory(tmp_path)
