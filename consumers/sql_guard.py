"""What the analysts' SQL endpoint lets through, decided on ClickHouse's own parse of the query.

The query is parsed by ClickHouse (``EXPLAIN AST``; nothing runs) and its tree is checked
(``check_ast``, pure): one SELECT (``WITH``/``UNION`` allowed) and nothing else at the top — no
``INTO OUTFILE``, no ``FORMAT``, no ``SETTINGS``; every table it reads is a table or view of
the phaseroute database (or a name defined by its own ``WITH``), never another database
(``system`` included) and never a table function; and no function that is also a table
function (``file``, ``url``, ``s3``, ``remote``, ``executable``, ``input``, ``python``...) appears
anywhere, since ``file(path)`` is a scalar that reads files too. On top of the check, the
query runs in a readonly session with time, memory and result-size limits
(consumers/query_server.py).
"""

from __future__ import annotations

import re

# Used when system.table_functions cannot be read; the live list replaces it.
KNOWN_TABLE_FUNCTIONS = frozenset({
    "file", "filecluster", "url", "urlcluster", "s3", "s3cluster", "gcs", "oss", "cosn", "hdfs", "hdfscluster",
    "azureblobstorage", "azureblobstoragecluster", "remote", "remotesecure", "cluster", "clusterallreplicas",
    "mysql", "postgresql", "jdbc", "odbc", "sqlite", "mongodb", "redis", "executable", "input", "python",
    "arrowstream", "merge", "loop", "dictionary", "view", "viewifpermitted", "viewexplain", "iceberg",
    "deltalake", "hudi", "paimon", "generaterandom", "fuzzjson", "fuzzquery", "eval", "filesystem", "ytsaurus",
    "bigquery", "prometheusquery", "prometheusqueryrange",
})
_LINE = re.compile(r"^( *)(\S+)(?: (.*?))?(?: \(children \d+\))?$")
_ALLOWED_TOP = ("ExpressionList",)


class QueryRefused(ValueError):
    """The query is not one the endpoint serves; the message says what to change."""


def _parse(lines: list[str]) -> list[tuple[int, str, str]]:
    nodes = []
    for line in lines:
        match = _LINE.match(line.rstrip())
        if match:
            nodes.append((len(match.group(1)), match.group(2), (match.group(3) or "").strip()))
    return nodes


def check_ast(lines: list[str], database: str, table_functions: frozenset[str], client_format: str = "Native") -> None:
    """Raise QueryRefused unless the ``EXPLAIN AST`` lines are an allowed SELECT."""
    nodes = _parse(lines)
    if not nodes or nodes[0][1] != "SelectWithUnionQuery":
        kind = nodes[0][1] if nodes else "nothing"
        raise QueryRefused(f"only SELECT queries are served (this is a {kind})")
    for depth, node, arg in nodes:
        if depth == 1 and node not in _ALLOWED_TOP and not (node == "Identifier" and arg == client_format):
            what = {"Literal": "INTO OUTFILE", "Identifier": f"FORMAT {arg}", "Set": "SETTINGS"}.get(node, node)
            raise QueryRefused(f"{what} is not allowed: send a plain SELECT (results come back as JSON)")
        if node == "Set":
            raise QueryRefused("SETTINGS clauses are not allowed; the endpoint sets the limits")
    for index, (depth, node, arg) in enumerate(nodes):
        if node == "Function" and arg.split(" ")[0].lower() in table_functions:
            raise QueryRefused(f"function {arg.split(' ')[0]!r} reaches outside the phaseroute tables and is not allowed")
        if node == "TableExpression":
            child = nodes[index + 1] if index + 1 < len(nodes) else (0, "", "")
            if child[0] != depth + 1 or child[1] not in ("TableIdentifier", "Subquery"):
                name = child[2].split(" ")[0] if child[2] else child[1]
                raise QueryRefused(f"reading from {name!r} is not allowed: only tables of the {database!r} database")
            if child[1] == "TableIdentifier":
                _check_table(child[2].split(" ")[0], database)


def _check_table(name: str, database: str) -> None:
    db, dot, table = name.rpartition(".")
    if not dot:
        return  # unqualified: a WITH name or a table of the session's database (the phaseroute one)
    if db != database:
        raise QueryRefused(f"table {name!r} is outside the {database!r} database; only its tables are served")
    if not table:
        raise QueryRefused(f"table name {name!r} is incomplete")


def single_statement(sql: str) -> str:
    """``sql`` without a trailing ';', if it holds exactly one statement: a ';' outside
    quotes and comments is refused before anything reaches ClickHouse (whose embedded engine
    would run every statement of a multi-statement text)."""
    text = sql.strip()
    while text.endswith(";"):
        text = text[:-1].rstrip()
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "'\"`":
            i += 1
            while i < n and text[i] != ch:
                i += 2 if text[i] == "\\" else 1
        elif text.startswith("--", i) or ch == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 1
        elif ch == ";":
            raise QueryRefused("send one statement: ';' separates statements and only one is served")
        i += 1
    return text
