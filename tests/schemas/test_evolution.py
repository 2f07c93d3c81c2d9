"""Schema evolution through the fingerprint: a v2 of job_submitted adds an optional top-level
field and a defaulted field inside the nested Sampling record. Old writers and new readers,
new writers and old readers, all decode what they can."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from phaseroute.schemas.deadletter import Rejected, safe_decode
from phaseroute.schemas.errors import UnknownFingerprintError
from phaseroute.schemas.examples import example
from phaseroute.schemas.registry import Registry, default_registry
from phaseroute.schemas.serde import Serde

KIND = "job_submitted"


def _v2(source: dict) -> dict:
    v2 = json.loads(json.dumps(source))
    v2["fields"].append({"name": "client_ref", "type": ["null", "string"], "default": None,
                         "doc": "Client's own reference for the job (added in v2)."})
    sampling = next(f for f in v2["fields"] if f["name"] == "sampling")["type"]
    sampling["fields"].append({"name": "repetition_penalty", "type": "double", "default": 1.0,
                               "doc": "Penalty on repeated tokens (unitless; 1 = none; added in v2)."})
    return v2


@pytest.fixture()
def serdes(tmp_path: Path) -> tuple[Serde, Serde]:
    """(old, new): old ships only v1; new ships v2 as current and v1 in history/."""
    shipped = Path(default_registry().current(KIND).origin).parent
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    shutil.copytree(shipped, old_dir)
    shutil.copytree(shipped, new_dir)
    v1 = json.loads((old_dir / f"{KIND}.avsc").read_text())
    (new_dir / "history").mkdir(exist_ok=True)
    shutil.copy(old_dir / f"{KIND}.avsc", new_dir / "history" / f"{KIND}.v1.avsc")
    (new_dir / f"{KIND}.avsc").write_text(json.dumps(_v2(v1), indent=2))
    return Serde(Registry.from_directory(old_dir)), Serde(Registry.from_directory(new_dir))


def test_the_new_registry_knows_both_versions(serdes: tuple[Serde, Serde]) -> None:
    old, new = serdes
    v1, v2 = new.registry.versions(KIND)
    assert (v1.version, v2.version) == (1, 2) and new.registry.current(KIND) is v2
    assert v1.fingerprint == old.registry.current(KIND).fingerprint != v2.fingerprint


def test_old_writer_new_reader_fills_the_defaults(serdes: tuple[Serde, Serde]) -> None:
    old, new = serdes
    record = example(KIND)
    data = old.encode(KIND, record)
    kind, decoded = new.decode(data, expected_kind=KIND)
    assert kind == KIND
    assert decoded["client_ref"] is None
    assert decoded["sampling"]["repetition_penalty"] == 1.0
    del decoded["client_ref"], decoded["sampling"]["repetition_penalty"]
    assert decoded == record


def test_new_writer_old_reader_drops_the_new_fields_once_it_knows_the_writer(serdes: tuple[Serde, Serde]) -> None:
    old, new = serdes
    record = example(KIND)
    record["client_ref"] = "ticket-88"
    record["sampling"]["repetition_penalty"] = 1.2
    data = new.encode(KIND, record)
    assert int.from_bytes(data[2:10], "little") == new.registry.current(KIND).fingerprint

    # An old reader that never saw v2 cannot resolve it: a precise dead letter, no crash.
    with pytest.raises(UnknownFingerprintError, match="unknown writer fingerprint 0x"):
        old.decode(data)
    out = safe_decode(data, b"k", topic="jobs.submitted", partition=0, offset=9, service="admission",
                      now_ms=0, serde=old)
    assert isinstance(out, Rejected) and "for the kinds" not in out.dead_letter["reason"]
    assert "topic jobs.submitted partition 0 offset 9" in out.dead_letter["reason"]

    # Given the v2 writer schema (for example from a newer release's history), it resolves v2 -> v1.
    aware = Serde(old.registry.extended([new.registry.current(KIND)]))
    kind, decoded = aware.decode(data, expected_kind=KIND)
    assert aware.registry.current(KIND).fingerprint == old.registry.current(KIND).fingerprint
    assert "client_ref" not in decoded and "repetition_penalty" not in decoded["sampling"]
    del record["client_ref"], record["sampling"]["repetition_penalty"]
    assert decoded == record


def test_new_writer_new_reader_keeps_the_new_fields(serdes: tuple[Serde, Serde]) -> None:
    _, new = serdes
    record = example(KIND)
    record["client_ref"] = "ticket-88"
    record["sampling"]["repetition_penalty"] = 1.2
    assert new.decode(new.encode(KIND, record)) == (KIND, record)
