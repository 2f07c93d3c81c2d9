"""One ClickHouse client for embedded chdb and a real server, and the DDL applied idempotently.

``connect(settings)`` returns a clickhouse-connect client: on ``chdb://<home>/chdb`` by
default (one process owns that data path: the telemetry service), or on the server named by
``PHASEROUTE_CLICKHOUSE_URL``. ``apply_ddl`` runs every ``infra/sql/*.sql`` file
(``CREATE ... IF NOT EXISTS``), so it is safe at every start.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import clickhouse_connect
import pyarrow as pa

from phaseroute.config import Settings


class ClickHouseLockedError(RuntimeError):
    """Another process owns the embedded chdb data path."""


def chdb_owner(path: Path) -> int | None:
    """The PID of the process that holds the embedded ClickHouse at ``path`` (its ``status``
    file is locked while an engine runs on it), or None when none does; -1 when the holder
    does not say who it is."""
    status = path / "status"
    try:
        fd = os.open(status, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None  # a file left behind: nobody holds it
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        match = re.search(rb"PID:\s*(\d+)", os.read(fd, 4096))
        return int(match.group(1)) if match else -1
    finally:
        os.close(fd)


def locked_message(path: Path, owner: int | None) -> str:
    who = f"process {owner}" if owner and owner > 0 else "another process"
    return (f"the embedded ClickHouse at {path} is held by {who} (chdb allows one; normally the telemetry "
            "service of `phaseroute up --pools`); stop it with `phaseroute down`, or set "
            "PHASEROUTE_CLICKHOUSE_URL to a ClickHouse server")


def connect(settings: Settings) -> Any:
    """A clickhouse-connect client (embedded chdb or server) with the database created.
    Raises ClickHouseLockedError, naming the holder, when another process holds the embedded chdb."""
    dsn = settings.clickhouse_dsn()
    if dsn.startswith("chdb://"):
        settings.chdb_path.mkdir(parents=True, exist_ok=True)
        owner = chdb_owner(settings.chdb_path)
        if owner is not None and owner != os.getpid():
            raise ClickHouseLockedError(locked_message(settings.chdb_path, owner))
    try:
        client = clickhouse_connect.get_client(dsn=dsn)
    except Exception as exc:  # chdb reports a held lock as a generic error
        text = str(exc).lower()
        if "lock" in text or "unable to open the chdb engine" in text:
            raise ClickHouseLockedError(locked_message(settings.chdb_path, chdb_owner(settings.chdb_path))) from exc
        raise
    client.command(f"CREATE DATABASE IF NOT EXISTS {settings.clickhouse_database}")
    return client


def ddl_statements(database: str) -> list[str]:
    """Every statement of every ``infra/sql/*.sql`` file, with ``{db}`` filled in."""
    statements: list[str] = []
    sql_dir = resources.files("phaseroute.infra") / "sql"
    for entry in sorted(sql_dir.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".sql"):
            continue
        text = "\n".join(line for line in entry.read_text().splitlines() if not line.lstrip().startswith("--"))
        statements.extend(s.strip().replace("{db}", database) for s in text.split(";") if s.strip())
    return statements


def apply_ddl(client: Any, database: str) -> int:
    """Create every table and view that does not exist yet; return how many statements ran."""
    statements = ddl_statements(database)
    for statement in statements:
        client.command(statement)
    return len(statements)


def insert_rows(client: Any, table: str, rows: list[dict[str, Any]], columns: list[str]) -> int:
    """Insert dict rows as one Arrow batch (the fast path on chdb); return the row count."""
    if not rows:
        return 0
    batch = pa.table({c: [r.get(c) for r in rows] for c in columns})
    client.insert_arrow(table, batch)
    return len(rows)
