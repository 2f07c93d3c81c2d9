"""The analysts' SQL endpoint as a hostile user meets it: the real telemetry service (its own
embedded chdb) answering over HTTP. Each hole found on the way gets a query here: files read
through table functions and the scalar file(), INTO OUTFILE, url() back at the endpoint,
other databases, writes, multi-statements, settings; no token or a wrong one; and the service
stops on SIGTERM right after such queries."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from phaseroute.consumers.query_server import QueryError, remote_query
from phaseroute.consumers.sql_guard import QueryRefused, single_statement

SECRET = "phaseroute-secret-line-7f3a"


def test_single_statement_finds_separators_outside_quotes_and_comments() -> None:
    assert single_statement("SELECT 1 ;; ") == "SELECT 1"
    assert single_statement("SELECT ';' AS a, `x;y` -- ; in a comment\n") == "SELECT ';' AS a, `x;y` -- ; in a comment"
    assert single_statement("SELECT 'it''s' /* ; */") == "SELECT 'it''s' /* ; */"
    for text in ("SELECT 1; SELECT file('/etc/hostname')", "SELECT 'a\\\\'; SELECT 2", "SELECT 1 /* x */; DROP TABLE t"):
        with pytest.raises(QueryRefused, match="one statement"):
            single_statement(text)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def service(bootstrap: str, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("query-home")
    secret = home / "secret.txt"
    secret.write_text(SECRET + "\n")
    port = _free_port()
    env = dict(os.environ, PHASEROUTE_HOME=str(home), PHASEROUTE_TELEMETRY_PORT=str(port),
               PHASEROUTE_QUERY_TIMEOUT_S="3", PHASEROUTE_BOOTSTRAP_SERVERS=bootstrap)
    log = open(home / "telemetry.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "phaseroute.cli.main", "sink", "telemetry"], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    token_file = home / "secrets" / "query-token"
    deadline = time.time() + 120
    while time.time() < deadline:
        assert proc.poll() is None, (home / "telemetry.log").read_text()[-3000:]
        if token_file.exists():
            try:
                remote_query(port, "SELECT 1 AS one", timeout_s=5, token=token_file.read_text().strip())
                break
            except QueryError:
                pass
        time.sleep(0.5)
    else:
        pytest.fail("the telemetry service did not answer within 120 s")
    yield proc, port, token_file.read_text().strip(), secret, home
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


HOSTILE = [
    ("SELECT * FROM file('{secret}', 'LineAsString')", "reading from 'file' is not allowed"),
    ("SELECT file('{secret}')", "function 'file'"),
    ("SELECT 1 WHERE 'x' IN file('{secret}', 'LineAsString')", "function 'file'"),
    ("SELECT 1 INTO OUTFILE '{home}/written.txt'", "INTO OUTFILE is not allowed"),
    ("SELECT * FROM url('http://127.0.0.1:{port}/query?sql=SELECT+1', 'LineAsString')", "reading from 'url'"),
    ("SELECT name FROM system.tables", "'system.tables' is outside the 'phaseroute' database"),
    ("SELECT * FROM executable('cat {secret}', 'TSV', 'x String')", "reading from 'executable'"),
    ("SELECT * FROM remote('127.0.0.1:9000', system.one)", "reading from 'remote'"),
    ("SELECT 1; SELECT file('{secret}')", "one statement"),
    ("INSERT INTO phaseroute.phase_telemetry SELECT * FROM phaseroute.phase_telemetry", "only SELECT queries"),
    ("DROP TABLE phaseroute.phase_telemetry", "only SELECT queries"),
    ("SELECT 1 FORMAT JSON", "FORMAT JSON is not allowed"),
    ("SELECT 1 SETTINGS readonly = 0", "readonly"),
]


@pytest.mark.kafka
@pytest.mark.parametrize("template,needle", HOSTILE)
def test_hostile_queries_are_refused_with_a_reason(service, template: str, needle: str) -> None:
    _, port, token, secret, home = service
    with pytest.raises(QueryError) as err:
        remote_query(port, template.format(secret=secret, home=home, port=port), token=token)
    assert needle in str(err.value)
    assert SECRET not in str(err.value)
    assert not (home / "written.txt").exists()


@pytest.mark.kafka
def test_selects_on_phaseroute_tables_are_served_and_bounded(service) -> None:
    _, port, token, _, _ = service
    answer = remote_query(port, "WITH t AS (SELECT count() AS n FROM phaseroute.phase_telemetry) SELECT n FROM t",
                          token=token)
    assert answer["columns"] == ["n"] and len(answer["rows"]) == 1
    started = time.time()
    with pytest.raises(QueryError, match="(?i)timeout|time limit|TIMEOUT_EXCEEDED"):
        # 10^10 hashed pairs: minutes of work that no optimizer can skip (a bare count() of the
        # cross join finished within the limit on a quiet machine)
        remote_query(port, "SELECT sum(sipHash64(a, b)) FROM (SELECT arrayJoin(range(100000)) AS a) AS x "
                           "CROSS JOIN (SELECT arrayJoin(range(100000)) AS b) AS y", token=token)
    assert time.time() - started < 15, "PHASEROUTE_QUERY_TIMEOUT_S=3 bounds a query"


@pytest.mark.kafka
def test_no_token_or_a_wrong_one_is_refused(service) -> None:
    _, port, _, _, _ = service
    for token in ("", "not-the-token"):
        with pytest.raises(QueryError, match="missing or wrong token"):
            remote_query(port, "SELECT 1", token=token or " ")


@pytest.mark.kafka
def test_the_service_stops_on_sigterm_after_hostile_queries(service) -> None:
    proc, port, token, _, _ = service
    for template, _ in HOSTILE[:5]:
        try:
            remote_query(port, template.format(secret="/etc/hostname", home="/tmp", port=port), token=token, timeout_s=10)
        except QueryError:
            pass
    started = time.time()
    proc.send_signal(signal.SIGTERM)
    proc.wait(45)
    assert time.time() - started < 45
    with pytest.raises(QueryError, match="no telemetry service answers"):
        remote_query(port, "SELECT 1", token=token, timeout_s=5)
