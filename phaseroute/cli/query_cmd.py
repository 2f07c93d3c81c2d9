"""``phaseroute query SQL``: read-only SQL on the telemetry in ClickHouse, as a table, CSV or JSON.

The statement goes to the telemetry service's query port (it owns the embedded chdb), or to the
server named by ``PHASEROUTE_CLICKHOUSE_URL``. Tables never cut a value or a header: on a
terminal, wide cells wrap inside their column; into a pipe or file the table is as wide as its
content. ``--format csv`` (a header row, then one line per row) and ``--format json`` (one
document: ``{"columns": [...], "rows": [[...], ...]}``; ``--json`` is the same) are for programs.
"""

from __future__ import annotations

import csv
import enum
import sys
from typing import Any

import typer

from phaseroute.cli.common import current_settings, errors_as_messages, fail, json_stdout
from phaseroute.cli.common import print_table as show_table


class Format(enum.Enum):
    TABLE = "table"
    CSV = "csv"
    JSON = "json"


def query(
    sql: str = typer.Argument(..., help="A read-only statement (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN)."),
    output: str = typer.Option("table", "--format", "-f", help="table, csv or json."),
    as_json: bool = typer.Option(False, "--json", help="Same as --format json."),
) -> None:
    """Query the telemetry in ClickHouse (the telemetry service's chdb, or the server)."""
    try:
        chosen = Format.JSON if as_json else Format(output.lower())
    except ValueError:
        fail(f"--format {output!r} must be one of {', '.join(f.value for f in Format)}")
        raise  # unreachable
    with json_stdout(chosen is Format.JSON) as emit:
        answer = _ask(sql)
        if chosen is Format.JSON:
            emit(answer)
            return
    if chosen is Format.CSV:
        write_csv(answer)
    else:
        print_table(answer, sys.stdout.isatty())


def _ask(sql: str) -> dict[str, Any]:
    from phaseroute.consumers.query_server import QueryError, remote_query, run_query
    from phaseroute.infra.clickhouse import ClickHouseLockedError, connect

    settings = current_settings()
    with errors_as_messages(QueryError, ClickHouseLockedError):
        if settings.clickhouse_url:
            return run_query(connect(settings), sql)
        return remote_query(settings.telemetry_port, sql)
    raise AssertionError("unreachable")  # pragma: no cover


def write_csv(answer: dict[str, Any]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(answer["columns"])
    writer.writerows(answer["rows"])


def print_table(answer: dict[str, Any], terminal: bool) -> None:
    """On a terminal: as wide as the terminal, cells wrapping inside columns at least as wide as
    their headers (when even the headers do not fit, one ``column: value`` block per row).
    Elsewhere: as wide as the content, nothing cut."""
    from rich.console import Console
    from rich.table import Table

    columns = [str(name) for name in answer["columns"]]
    if terminal and sum(len(c) + 3 for c in columns) + 1 > Console().width:
        _print_records(Console(), columns, answer["rows"])
        return
    from rich.text import Text

    table = Table()
    for name in columns:
        table.add_column(Text(name))
    for row in answer["rows"]:
        table.add_row(*(Text(_text(v)) for v in row))  # data, not markup
    show_table(table, terminal)


def _text(value: Any) -> str:
    return "NULL" if value is None else str(value)


def _print_records(console: Any, columns: list[str], rows: list[list[Any]]) -> None:
    """Rows as blocks of ``column: value`` lines (psql's expanded display), for narrow terminals."""
    pad = max(len(c) for c in columns)
    for i, row in enumerate(rows, start=1):
        console.print(f"-[ row {i} ]" + "-" * max(0, pad - 6), markup=False, highlight=False)
        for name, value in zip(columns, row):
            console.print(f"{name.ljust(pad)} | {_text(value)}", markup=False, highlight=False)
