"""A store whose last batch of writes can be undone: the harness's model of a crash that lost the
control plane's latest table writes (they were buffered, the sends were not). Besides the core's
three tables it holds ``tracked``, the job tracker's records (live: its changelog)."""

from __future__ import annotations

import json
from collections.abc import Iterator, MutableMapping
from typing import Any

_MISSING = object()


class JournalDict(MutableMapping[str, Any]):
    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.data: dict[str, Any] = dict(data or {})
        self._undo: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._undo.setdefault(key, self.data.get(key, _MISSING))
        self.data[key] = value

    def __delitem__(self, key: str) -> None:
        self._undo.setdefault(key, self.data.get(key, _MISSING))
        del self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def mark(self) -> None:
        self._undo.clear()

    def rollback(self) -> None:
        for key, old in self._undo.items():
            if old is _MISSING:
                self.data.pop(key, None)
            else:
                self.data[key] = old
        self._undo.clear()


class JournalStore:
    """A ``CoreStore`` of journaled dicts; ``reloaded`` is what a restarted process reads back (a
    JSON round trip, as a changelog holds the records)."""

    enabled = True

    def __init__(self, jobs: dict[str, Any] | None = None, requests: dict[str, Any] | None = None,
                 tenants: dict[str, Any] | None = None, tracked: dict[str, Any] | None = None) -> None:
        self.jobs, self.requests, self.tenants = JournalDict(jobs), JournalDict(requests), JournalDict(tenants)
        self.tracked = JournalDict(tracked)

    def _tables(self) -> tuple[JournalDict, ...]:
        return self.jobs, self.requests, self.tenants, self.tracked

    def mark(self) -> None:
        for table in self._tables():
            table.mark()

    def rollback(self) -> None:
        for table in self._tables():
            table.rollback()

    def reloaded(self) -> JournalStore:
        copy: dict[str, dict[str, Any]] = json.loads(json.dumps(
            {"jobs": self.jobs.data, "requests": self.requests.data, "tenants": self.tenants.data,
             "tracked": self.tracked.data}))
        return JournalStore(copy["jobs"], copy["requests"], copy["tenants"], copy["tracked"])
