"""Base of the typed records: frozen dataclasses that convert to and from Avro record dicts.

The conversion is driven by each dataclass's type hints (nested records, enums, lists,
maps, optionals), compiled once per class. The .avsc files stay the source of truth;
tests/schemas/test_typed.py fails when a dataclass drifts from its schema.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from enum import Enum
from typing import Any, ClassVar, Self

Convert = Callable[[Any], Any]


class AvroRecord:
    """Mixin of every typed record; subclasses are ``@dataclass(frozen=True, slots=True, kw_only=True)``."""

    __slots__ = ()
    #: Message kind (the .avsc file stem) of top-level records; None for nested records.
    KIND: ClassVar[str | None] = None

    def to_dict(self) -> dict[str, Any]:
        """The Avro record dict (enums as their symbol strings), ready for serde.encode."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Build from a decoded record dict; missing fields take the dataclass default."""
        converters = _converters(cls)
        unknown = data.keys() - converters.keys()
        if unknown:
            raise TypeError(f"{cls.__name__} has no field(s) {sorted(unknown)}; its fields are {list(converters)}")
        return cls(**{name: converters[name](value) for name, value in data.items()})


def _plain(value: Any) -> Any:
    if isinstance(value, AvroRecord):
        return value.to_dict()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


_CACHE: dict[type, dict[str, Convert]] = {}


def _converters(cls: type) -> dict[str, Convert]:
    converters = _CACHE.get(cls)
    if converters is None:
        hints = typing.get_type_hints(cls)
        converters = {f.name: _converter(hints[f.name]) for f in dataclasses.fields(cls)}
        _CACHE[cls] = converters
    return converters


def _identity(value: Any) -> Any:
    return value


def _converter(hint: Any) -> Convert:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        inner = _converter(next(a for a in args if a is not type(None)))
        return lambda value: None if value is None else inner(value)
    if origin is list:
        item = _converter(args[0])
        return lambda value: [item(v) for v in value]
    if origin is dict:
        item = _converter(args[1])
        return lambda value: {k: item(v) for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, AvroRecord):
        return lambda value: value if isinstance(value, hint) else hint.from_dict(value)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint
    return _identity
