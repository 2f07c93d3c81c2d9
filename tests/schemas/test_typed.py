"""The typed records and enums never drift from the .avsc files; JobState is ordered."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import pytest

from phaseroute.schemas.enums import AVRO_ENUMS, JobState
from phaseroute.schemas.kinds import RECORD_TYPES, record_type
from phaseroute.schemas.registry import default_registry
from phaseroute.schemas.typed import AvroRecord

PRIMITIVES = {"string": str, "int": int, "long": int, "double": float, "float": float, "boolean": bool, "bytes": bytes}


def _avro_shape(avro: Any) -> Any:
    """A comparable shape of an Avro type: a Python type, or ("list"|"dict"|"optional"|"record", ...)."""
    if isinstance(avro, str):
        return PRIMITIVES[avro]
    if isinstance(avro, list):
        (inner,) = [b for b in avro if b != "null"]
        return ("optional", _avro_shape(inner))
    kind = avro["type"]
    if kind == "array":
        return ("list", _avro_shape(avro["items"]))
    if kind == "map":
        return ("dict", str, _avro_shape(avro["values"]))
    if kind == "enum":
        return AVRO_ENUMS[f"phaseroute.{avro['name']}"]
    if kind == "record":
        return ("record", avro["name"])
    return PRIMITIVES[kind]


def _hint_shape(hint: Any) -> Any:
    """The same shape for a Python annotation."""
    if isinstance(hint, type) and issubclass(hint, AvroRecord):
        return ("record", hint.__name__)
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return ("optional", _hint_shape(inner))
    if origin in (list, dict):
        return (origin.__name__, *map(_hint_shape, typing.get_args(hint)))
    return hint


def _check_record(cls: type, schema: dict[str, Any], problems: list[str]) -> None:
    fields = dataclasses.fields(cls)
    hints = typing.get_type_hints(cls)
    avro_names = [f["name"] for f in schema["fields"]]
    if [f.name for f in fields] != avro_names:
        problems.append(f"{cls.__name__} fields {[f.name for f in fields]} != .avsc {avro_names}")
        return
    for field, avro in zip(fields, schema["fields"]):
        if _hint_shape(hints[field.name]) != _avro_shape(avro["type"]):
            problems.append(f"{cls.__name__}.{field.name}: {hints[field.name]} does not match Avro {avro['type']}")
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        if ("default" in avro) != (default is not dataclasses.MISSING) or ("default" in avro and default != avro["default"]):
            problems.append(f"{cls.__name__}.{field.name}: default {default!r} != .avsc {avro.get('default', 'none')!r}")
        nested = avro["type"]
        nested = next((b for b in nested if b != "null"), nested) if isinstance(nested, list) else nested
        while isinstance(nested, dict) and nested["type"] in ("array", "map"):
            nested = nested["items"] if nested["type"] == "array" else nested["values"]
        if isinstance(nested, dict) and nested["type"] == "record":
            inner = typing.get_args(hints[field.name]) or (hints[field.name],)
            inner_cls = next(a for a in _flatten(inner) if isinstance(a, type) and issubclass(a, AvroRecord))
            _check_record(inner_cls, nested, problems)


def _flatten(args: tuple) -> list:
    out = []
    for arg in args:
        out.append(arg)
        out.extend(_flatten(typing.get_args(arg)))
    return out


@pytest.mark.parametrize("kind", sorted(default_registry().kinds()))
def test_typed_record_matches_its_avsc(kind: str) -> None:
    cls = record_type(kind)
    schema = default_registry().current(kind).source
    assert cls.KIND == kind and cls.__name__ == schema["name"]
    problems: list[str] = []
    _check_record(cls, schema, problems)
    assert not problems, "\n".join(problems)


def test_every_avro_enum_is_mirrored_with_the_same_symbols_in_order() -> None:
    seen = set()
    for version in default_registry():
        stack: list[Any] = [version.source]
        while stack:
            node = stack.pop()
            if isinstance(node, list):
                stack.extend(node)
            elif isinstance(node, dict):
                if node.get("type") == "enum":
                    assert [m.value for m in AVRO_ENUMS[f"phaseroute.{node['name']}"]] == node["symbols"]
                    seen.add(f"phaseroute.{node['name']}")
                stack.extend(v for k, v in node.items() if k in ("type", "fields", "items", "values"))
    assert seen == set(AVRO_ENUMS)


def test_every_kind_has_a_record_type() -> None:
    assert set(RECORD_TYPES) == set(default_registry().kinds())


def test_job_state_is_ordered_by_life_cycle_stage() -> None:
    s = JobState
    assert s.SUBMITTED < s.ADMITTED < s.RUNNING < s.COMPLETED
    assert s.SUBMITTED < s.REJECTED < s.RUNNING
    assert all(state >= s.COMPLETED for state in (s.COMPLETED, s.FAILED, s.CANCELLED, s.EXPIRED))
    assert not s.RUNNING >= s.COMPLETED
    assert not s.FAILED > s.COMPLETED and not s.FAILED < s.COMPLETED and s.FAILED != s.COMPLETED
    assert "FAILED" >= s.COMPLETED and s.RUNNING < "EXPIRED"  # decoded records hold plain strings
    assert [x for x in s if x.is_finished] == [s.REJECTED, s.COMPLETED, s.FAILED, s.CANCELLED, s.EXPIRED]
    assert s.ADMITTED.can_move_to(s.RUNNING) and s.SUBMITTED.can_move_to("EXPIRED")
    assert not s.ADMITTED.can_move_to(s.REJECTED) and not s.COMPLETED.can_move_to(s.FAILED)
    assert not s.RUNNING.can_move_to(s.RUNNING)
    with pytest.raises(TypeError, match="cannot compare a JobState with 3"):
        _ = s.RUNNING < 3
    with pytest.raises(ValueError, match="'DONE' is not a valid JobState"):
        _ = s.RUNNING < "DONE"
