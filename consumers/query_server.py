"""Read-only SQL over HTTP for analysts, served by the process that owns the embedded chdb.

chdb lets one process hold a data path, so in embedded mode the telemetry service answers
analysts' queries (``phaseroute query``, the demo summary, the drift report):
``GET /query?sql=SELECT...`` with ``Authorization: Bearer <token>`` returns ``{"columns": [...],
"rows": [[...], ...]}``. Life of a query here:
1. the token is checked in constant time (401 otherwise; repeated failures get 429); the token
   is ``PHASEROUTE_QUERY_TOKEN`` or, unset, a random one written to ``home/secrets/query-token``
   (mode 0600) at start, which local clients (``remote_query``) read;
2. at most ``query_concurrency`` queries are served at once (503 beyond);
3. ClickHouse parses it (``EXPLAIN AST``) and ``sql_guard.check_ast`` allows only a SELECT on the
   phaseroute tables: no table functions or functions reaching files/URLs/other engines, no
   other database, no INTO OUTFILE / FORMAT / SETTINGS (400 naming what was refused);
4. it runs in its own session, set ``readonly=1`` after its limits (``max_execution_time``,
   ``max_memory_usage``, ``max_result_rows``), so neither the query nor its text can lift them;
   the engine lock is taken with a timeout, so a query can never hold the telemetry sink (and
   its SIGTERM handling) hostage.
It listens on localhost only.
"""

from __future__ import annotations

import datetime
import decimal
import hmac
import json
import os
import secrets
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from phaseroute.consumers.sql_guard import (
    KNOWN_TABLE_FUNCTIONS,
    QueryRefused,
    check_ast,
    single_statement,
)

MAX_RESULT_ROWS = 100_000
MAX_SQL_CHARS = 100_000


class QueryError(RuntimeError):
    """The query was refused or failed; the message says why."""


class QueryBusy(QueryError):
    """Too many queries at once, or the engine is busy past the wait limit."""


class LockedClient:
    """A ClickHouse client whose calls are serialized (chdb's engine is not thread-safe).
    Several clients (sessions) of one engine share one lock; with ``timeout_s`` a call that
    cannot get the lock in time raises QueryBusy instead of waiting forever."""

    def __init__(self, client: Any, lock: threading.Lock | None = None, timeout_s: float | None = None) -> None:
        self._client = client
        self.lock = lock or threading.Lock()
        self._timeout_s = timeout_s

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def locked(*args: Any, **kwargs: Any) -> Any:
            if not self.lock.acquire(timeout=-1 if self._timeout_s is None else self._timeout_s):
                raise QueryBusy(f"the ClickHouse engine stayed busy for {self._timeout_s:.0f} s; try again")
            try:
                return attr(*args, **kwargs)
            finally:
                self.lock.release()

        return locked


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def limit_settings(timeout_s: float, max_memory_bytes: int) -> dict[str, Any]:
    return {"max_execution_time": timeout_s, "timeout_overflow_mode": "throw", "max_memory_usage": max_memory_bytes,
            "max_result_rows": MAX_RESULT_ROWS, "result_overflow_mode": "throw"}


def open_analyst_session(settings: Any, lock: threading.Lock | None) -> LockedClient:
    """A ClickHouse session of its own for analysts: limits set, then ``readonly=1`` (which
    forbids changing them), on the phaseroute database. With a server, the limits and
    ``readonly=2`` ride on every query instead (HTTP has no session)."""
    from phaseroute.infra.clickhouse import connect

    client = connect(settings)
    limits = limit_settings(settings.query_timeout_s, settings.query_max_memory_bytes)
    if settings.clickhouse_dsn().startswith("chdb://"):
        for name, value in limits.items():
            client.command(f"SET {name} = {value!r}" if isinstance(value, str) else f"SET {name} = {value}")
        client.command(f"USE {settings.clickhouse_database}")
        client.command("SET readonly = 1")
    else:
        client = _ServerSession(client, dict(limits, readonly=2), settings.clickhouse_database)
    return LockedClient(client, lock, timeout_s=settings.query_timeout_s + 10)


class _ServerSession:
    def __init__(self, client: Any, query_settings: dict[str, Any], database: str) -> None:
        self._client, self._settings, self._database = client, query_settings, database

    def query(self, sql: str) -> Any:
        return self._client.query(sql, settings=dict(self._settings, database=self._database))


def table_functions(session: Any) -> frozenset[str]:
    try:
        names = {str(r[0]).lower() for r in session.query("SELECT name FROM system.table_functions").result_rows}
    except Exception:
        names = set()
    return frozenset(names | KNOWN_TABLE_FUNCTIONS) - {"format"}  # format(): also a harmless string scalar


def run_query(session: Any, sql: str, database: str = "phaseroute", functions: frozenset[str] | None = None
              ) -> dict[str, Any]:
    """Check the query against ClickHouse's parse of it, then run it in ``session``."""
    try:
        sql = single_statement(sql)
    except QueryRefused as exc:
        raise QueryError(str(exc)) from None
    if not sql or len(sql) > MAX_SQL_CHARS:
        raise QueryError(f"send one SELECT statement of 1-{MAX_SQL_CHARS} characters")
    try:
        ast = [str(row[0]) for row in session.query(f"EXPLAIN AST {sql}").result_rows]
    except QueryBusy:
        raise
    except Exception as exc:
        raise QueryError(f"the query does not parse as one statement: {str(exc)[:500]}") from None
    try:
        check_ast(ast, database, functions if functions is not None else KNOWN_TABLE_FUNCTIONS)
    except QueryRefused as exc:
        raise QueryError(str(exc)) from None
    result = session.query(sql)
    return {"columns": list(result.column_names), "rows": [list(r) for r in result.result_rows]}


def query_token(settings: Any) -> str:
    """The endpoint's token: the setting, or the one in the token file (made if missing)."""
    if settings.query_token:
        return str(settings.query_token)
    path: Path = settings.query_token_file
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    return token


class QueryServer:
    """A ThreadingHTTPServer on localhost:port in a daemon thread."""

    def __init__(self, client: Any, port: int, settings: Any = None) -> None:
        from phaseroute.api.auth import FailureLimiter
        from phaseroute.config import settings as current

        settings = settings or current()
        lock = getattr(client, "lock", None)
        self.session = open_analyst_session(settings, lock)
        self.functions = table_functions(self.session)
        self.database = settings.clickhouse_database
        self.token = query_token(settings)
        self.slots = threading.BoundedSemaphore(settings.query_concurrency)
        self.limiter = FailureLimiter(max_failures=10, window_s=60.0)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            timeout = settings.query_timeout_s + 30  # a client that stalls mid-request is dropped

            def do_GET(self) -> None:
                parsed = urllib.parse.urlparse(self.path)
                if parsed.path != "/query":
                    return self._reply(404, {"error": f"unknown path {parsed.path!r}; use /query?sql=..."})
                status, body = owner.answer(self.client_address[0], self.headers.get("Authorization", ""),
                                            urllib.parse.parse_qs(parsed.query).get("sql", [""])[0])
                self._reply(status, body)

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body, default=_json_default).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:
                pass

        self.client = client
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="query-server", daemon=True)

    def answer(self, address: str, authorization: str, sql: str) -> tuple[int, dict[str, Any]]:
        if self.limiter.retry_after(address) is not None:
            return 429, {"error": "too many failed authentications; wait a minute"}
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.token.encode()):
            self.limiter.failed(address)
            return 401, {"error": "missing or wrong token: send 'Authorization: Bearer <token>' (the token is "
                                  "PHASEROUTE_QUERY_TOKEN or the file home/secrets/query-token)"}
        if not self.slots.acquire(blocking=False):
            return 503, {"error": "too many queries at once; try again shortly"}
        try:
            return 200, run_query(self.session, sql, self.database, self.functions)
        except QueryBusy as exc:
            return 503, {"error": str(exc)}
        except QueryError as exc:
            return 400, {"error": str(exc)}
        except Exception as exc:
            return 400, {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        finally:
            self.slots.release()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _local_token() -> str | None:
    from phaseroute.config import settings

    current = settings()
    if current.query_token:
        return str(current.query_token)
    path = current.query_token_file
    return path.read_text().strip() if path.exists() else None


def remote_query(port: int, sql: str, timeout_s: float = 30.0, token: str | None = None) -> dict[str, Any]:
    """Ask the telemetry service on localhost:port; QueryError carries its message."""
    url = f"http://127.0.0.1:{port}/query?" + urllib.parse.urlencode({"sql": sql})
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token or _local_token() or ''}"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        raise QueryError(json.loads(exc.read()).get("error", str(exc))) from None
    except urllib.error.URLError as exc:
        raise QueryError(
            f"no telemetry service answers on 127.0.0.1:{port} ({exc.reason}); start it with "
            "`phaseroute sink telemetry` (it owns the embedded ClickHouse) or set PHASEROUTE_CLICKHOUSE_URL"
        ) from None
