"""Strict record checking before encoding, compiled once per schema into nested closures.

fastavro's writer alone is lax: it truncates 2.5 to 2 for an int, writes True as 1, writes
2**40 into a 32-bit int and turns "1.5" into 1.5 for a double. The checker refuses all of
these, refuses fields the schema does not have (a typo in an optional field would otherwise be
dropped silently), accepts missing fields that have a default, and names the failing field
path (``requests[3].max_tokens``) and value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from phaseroute.schemas.errors import EncodeError

Check = Callable[[Any], None]

_INT_RANGE = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


class _Mismatch(Exception):
    """Raised by a compiled check; `path` is filled in on the way out."""

    def __init__(self, value: Any, problem: str) -> None:
        self.value = value
        self.problem = problem
        self.path: list[str] = []


def compile_checker(kind: str, schema: dict[str, Any]) -> Check:
    """A function that returns None for a valid record and raises EncodeError otherwise."""
    root = _compile(schema, {}, "phaseroute")

    def check(record: Any) -> None:
        try:
            root(record)
        except _Mismatch as bad:
            raise EncodeError(kind, "".join(reversed(bad.path)).lstrip("."), bad.value, bad.problem) from None

    return check


def _compile(schema: Any, names: dict[str, Check], namespace: str) -> Check:
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _PRIMITIVES[schema]
        full = schema if "." in schema else f"{namespace}.{schema}"
        return lambda value: names[full](value)  # named type defined elsewhere in the schema
    if isinstance(schema, list):
        return _union(schema, names, namespace)
    kind = schema["type"]
    if kind == "record":
        return _record(schema, names, namespace)
    if kind == "enum":
        return _named(schema, names, namespace, _enum(schema["symbols"]))
    if kind == "array":
        return _array(_compile(schema["items"], names, namespace))
    if kind == "map":
        return _map(_compile(schema["values"], names, namespace))
    if kind == "fixed":
        return _named(schema, names, namespace, _fixed(schema["size"]))
    return _compile(kind, names, namespace)  # {"type": "long", "logicalType": ...}


def _full_name(schema: dict[str, Any], namespace: str) -> str:
    name = schema["name"]
    return name if "." in name else f"{schema.get('namespace', namespace)}.{name}"


def _named(schema: dict[str, Any], names: dict[str, Check], namespace: str, check: Check) -> Check:
    names[_full_name(schema, namespace)] = check
    return check


def _record(schema: dict[str, Any], names: dict[str, Check], namespace: str) -> Check:
    full = _full_name(schema, namespace)
    inner_ns = full.rpartition(".")[0]
    fields: list[tuple[str, Check, bool]] = []
    allowed: set[str] = set()

    def check(value: Any) -> None:
        if not isinstance(value, Mapping):
            raise _Mismatch(value, f"is not a {full} record (a mapping)")
        extra = value.keys() - allowed
        if extra:
            name = sorted(extra)[0]
            bad = _Mismatch(value[name], f"is not a field of {full}; its fields are {', '.join(allowed_order)}")
            bad.path.append(f".{name}")
            raise bad
        for name, field_check, has_default in fields:
            if name in value:
                try:
                    field_check(value[name])
                except _Mismatch as bad:
                    bad.path.append(f".{name}")
                    raise
            elif not has_default:
                missing = _Mismatch(None, "is missing, and the field has no default")
                missing.path.append(f".{name}")
                raise missing

    names[full] = check  # before the fields: a record may refer to itself
    allowed_order = [f["name"] for f in schema["fields"]]
    for field in schema["fields"]:
        fields.append((field["name"], _compile(field["type"], names, inner_ns), "default" in field))
        allowed.add(field["name"])
    return check


def _union(branches: list[Any], names: dict[str, Check], namespace: str) -> Check:
    nullable = "null" in branches
    others = [_compile(b, names, namespace) for b in branches if b != "null"]
    shown = ", ".join(b if isinstance(b, str) else str(b.get("name", b.get("type"))) for b in branches)

    def check(value: Any) -> None:
        if value is None and nullable:
            return
        if len(others) == 1:  # the common ["null", X]: X's own error is the precise one
            others[0](value)
            return
        for other in others:
            try:
                other(value)
                return
            except _Mismatch:
                continue
        raise _Mismatch(value, f"matches none of the union [{shown}]")

    return check


def _enum(symbols: list[str]) -> Check:
    allowed = frozenset(symbols)

    def check(value: Any) -> None:
        if not (isinstance(value, str) and value in allowed):
            raise _Mismatch(value, f"is not one of the symbols {', '.join(symbols)}")

    return check


def _array(items: Check) -> Check:
    def check(value: Any) -> None:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch(value, "is not an array (a list)")
        for index, item in enumerate(value):
            try:
                items(item)
            except _Mismatch as bad:
                bad.path.append(f"[{index}]")
                raise

    return check


def _map(values: Check) -> Check:
    def check(value: Any) -> None:
        if not isinstance(value, Mapping):
            raise _Mismatch(value, "is not a map (a mapping of str to values)")
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Mismatch(key, "is not a str map key")
            try:
                values(item)
            except _Mismatch as bad:
                bad.path.append(f"[{key!r}]")
                raise

    return check


def _fixed(size: int) -> Check:
    def check(value: Any) -> None:
        if not isinstance(value, (bytes, bytearray)) or len(value) != size:
            raise _Mismatch(value, f"is not exactly {size} bytes")

    return check


def _integer(avro_type: str) -> Check:
    low, high = _INT_RANGE[avro_type]
    article = "an" if avro_type == "int" else "a"

    def check(value: Any) -> None:
        if type(value) is bool or not isinstance(value, int):
            raise _Mismatch(value, f"is not {article} {avro_type} (an integer)")
        if not low <= value <= high:
            raise _Mismatch(value, f"is out of the {avro_type} range [{low}, {high}]")

    return check


def _simple(types: tuple[type, ...], expected: str) -> Check:
    def check(value: Any) -> None:
        if type(value) is bool and bool not in types or not isinstance(value, types):
            raise _Mismatch(value, f"is not {expected}")

    return check


def _null(value: Any) -> None:
    if value is not None:
        raise _Mismatch(value, "is not null")


_PRIMITIVES: dict[str, Check] = {
    "null": _null,
    "boolean": _simple((bool,), "a boolean"),
    "int": _integer("int"),
    "long": _integer("long"),
    "float": _simple((int, float), "a float (a number)"),
    "double": _simple((int, float), "a double (a number)"),
    "string": _simple((str,), "a string"),
    "bytes": _simple((bytes, bytearray), "bytes"),
}
