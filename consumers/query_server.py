"""Read-only SQL over HTTP, served by the process that owns the embedded chdb data path.

chdb lets one process hold a data path, so in embedded mode the telemetry service answers
analysts' queries (``phaseroute query``) and the control plane's profile reads for everyone
else: ``GET /query?sql=SELECT...`` returns ``{"columns": [...], "rows": [[...], ...]}``.
Only SELECT / WITH / SHOW / DESCRIBE / EXPLAIN statements are accepted; anything else is a
400 naming the statement. It listens on localhost only.
"""

from __future__ import annotations

import datetime
import decimal
import json
import threading
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

READ_ONLY = ("select", "with", "show", "describe", "desc", "explain", "exists")


class QueryError(RuntimeError):
    """The query was refused or failed; the message says why."""


class LockedClient:
    """A ClickHouse client whose calls are serialized (chdb's connection is not thread-safe)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def locked(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)

        return locked


def check_read_only(sql: str) -> str:
    words = sql.strip().split(None, 1)
    if not words or words[0].lower() not in READ_ONLY:
        raise QueryError(f"only read-only statements ({', '.join(READ_ONLY)}) are served; got {sql.strip()[:60]!r}")
    return sql


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def run_query(client: Any, sql: str) -> dict[str, Any]:
    result = client.query(check_read_only(sql))
    return {"columns": list(result.column_names), "rows": [list(r) for r in result.result_rows]}


class QueryServer:
    """A ThreadingHTTPServer on localhost:port in a daemon thread."""

    def __init__(self, client: Any, port: int) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server naming)
                parsed = urllib.parse.urlparse(self.path)
                sql = urllib.parse.parse_qs(parsed.query).get("sql", [""])[0]
                if parsed.path != "/query":
                    return self._reply(404, {"error": f"unknown path {parsed.path!r}; use /query?sql=..."})
                try:
                    self._reply(200, run_query(owner.client, sql))
                except QueryError as exc:
                    self._reply(400, {"error": str(exc)})
                except Exception as exc:  # ClickHouse's own error text is the useful part
                    self._reply(400, {"error": f"{type(exc).__name__}: {exc}"[:2000]})

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
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="query-server", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def remote_query(port: int, sql: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Ask the telemetry service on localhost:port; QueryError carries its message."""
    url = f"http://127.0.0.1:{port}/query?" + urllib.parse.urlencode({"sql": sql})
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise QueryError(json.loads(exc.read()).get("error", str(exc))) from None
    except urllib.error.URLError as exc:
        raise QueryError(
            f"no telemetry service answers on 127.0.0.1:{port} ({exc.reason}); start it with "
            "`phaseroute sink telemetry` (it owns the embedded ClickHouse) or set PHASEROUTE_CLICKHOUSE_URL"
        ) from None
