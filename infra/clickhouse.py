"""One ClickHouse client for embedded chdb and a real server, and the DDL applied idempotently.

``connect(settings)`` returns a clickhouse-connect client: on ``chdb://<home>/chdb`` by
default (one process owns that data path: the telemetry service), or on the server named by
``PHASEROUTE_CLICKHOUSE_URL``. ``apply_ddl`` runs every ``infra/sql/*.sql`` file
(``CREATE ... IF NOT EXISTS``), so it is safe at every start.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import clickhouse_connect
import pyarrow as pa

from phaseroute.config import Settings


class ClickHouseLockedError(RuntimeError):
    """Another process owns the embedded chdb data path."""


def connect(settings: Settings) -> Any:
    """A clickhouse-connect client (embedded chdb or server) with the database created."""
    dsn = settings.clickhouse_dsn()
    if dsn.startswith("chdb://"):
        settings.chdb_path.mkdir(parents=True, exist_ok=True)
    try:
        client = clickhouse_connect.get_client(dsn=dsn)
    except Exception as exc:  # chdb reports a held lock as a generic error
        if "lock" in str(exc).lower():
            raise ClickHouseLockedError(
                f"the embedded ClickHouse data path {settings.chdb_path} is owned by another process "
                "(chdb allows one); stop it, or set PHASEROUTE_CLICKHOUSE_URL to a server"
            ) from exc
        raise
    client.command(f"CREATE DATABASE IF NOT EXISTS {settings.clickhouse_database}")
    return client


def ddl_statements(database: str) -> list[str]:
    """Every statement of every ``infra/sql/*.sql`` file, with ``{db}`` filled in."""
    statements = []
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
