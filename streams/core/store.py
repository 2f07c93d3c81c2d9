"""Where the control core persists its state, and the empty store of a driver that needs none.

A ``CoreStore`` is three mappings of plain JSON records: ``jobs`` (job id -> job record),
``requests`` (request id -> request record, deleted once the job's output is whole) and
``tenants`` (tenant -> VTC counter and served cost). The Faust shell passes changelog-backed
tables; the deterministic simulation tests pass dicts and rebuild a core from them mid-run;
the simulator's benchmark passes ``NullStore`` (nothing is kept, nothing is written).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class CoreStore(Protocol):
    @property
    def enabled(self) -> bool: ...

    @property
    def jobs(self) -> MutableMapping[str, Any]: ...

    @property
    def requests(self) -> MutableMapping[str, Any]: ...

    @property
    def tenants(self) -> MutableMapping[str, Any]: ...


@dataclass
class DictStore:
    """A store in plain dicts (tests, simulations with restarts)."""

    jobs: MutableMapping[str, Any] = field(default_factory=dict)
    requests: MutableMapping[str, Any] = field(default_factory=dict)
    tenants: MutableMapping[str, Any] = field(default_factory=dict)
    enabled: bool = True


class _Nothing(MutableMapping[str, Any]):
    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        pass

    def __delitem__(self, key: str) -> None:
        pass

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


@dataclass
class NullStore:
    """Keeps nothing: for a driver that never restarts its core."""

    jobs: MutableMapping[str, Any] = field(default_factory=_Nothing)
    requests: MutableMapping[str, Any] = field(default_factory=_Nothing)
    tenants: MutableMapping[str, Any] = field(default_factory=_Nothing)
    enabled: bool = False
