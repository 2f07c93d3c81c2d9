"""Every `--json` output is exactly one JSON document on stdout (issue 16 item 11: `plan --json`
began with HiGHS solver lines, so `json.load` failed at the first character).

Each command is run as a user runs it, a real process, and its stdout is parsed with
`json.loads`, which refuses anything before or after the one document. The commands are found
by walking the CLI, so a new `--json` command without a case here fails the first test.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer

from phaseroute.cli.main import app

CLI = [sys.executable, "-m", "phaseroute.cli.main"]
CALIBRATION = Path(__file__).resolve().parents[2] / "sim" / "data" / "calibration-cpu-smollm2.yaml"


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    needs: str = ""  # "" | "broker" | "telemetry" (a telemetry service's query port) | "model"
    elsewhere: str = ""  # a test in another module runs this command against a live stack


CASES: dict[str, Case] = {
    "topics": Case(("topics", "--json", "--check", "jobs.state", "--check", "profiles"), "broker"),
    "pools": Case(("pools", "--json", "--window-s", "30"), "broker"),
    "query": Case(("query", "SELECT 1 AS one, 'a' AS two", "--json"), "telemetry"),
    "report": Case(("report", "--json"), "telemetry"),
    "drift report": Case(("drift", "report", "--json"), "telemetry"),
    "sim": Case(("sim", "--workload", "azure-code", "--fleet", "h100-a100", "--policy", "jsq,phaseroute",
                 "--max-requests", "300", "--json")),
    "sim bench": Case(("sim", "bench", "--max-requests", "3000", "--json")),
    "sim bench-bound": Case(("sim", "bench-bound", "--json"), elsewhere="tests/sim/test_json_outputs.py (a small fleet)"),
    "sim capacity": Case(("sim", "capacity", "--json"), elsewhere="tests/sim/test_json_outputs.py (a small fleet)"),
    "tenants list": Case(("tenants", "list", "--json"), "broker"),
    "bench admission": Case(("bench", "admission", "--intake-only", "--lines", "200", "--json"), "model"),
    "sim fuzz": Case(("sim", "fuzz", "--seeds", "1", "--jobs", "3", "--json")),
    "sim tick-bench": Case(("sim", "tick-bench", "--queued", "2000", "--ticks", "20", "--json")),
    "sim drift": Case(("sim", "drift", "--shares", "0.1", "--phases", "1", "--json")),
    "plan": Case(("plan", "--workload", "azure-mixed", "--catalogue", "cloud", "--max-requests", "300",
                  "--confirm", "1", "--json")),
    "bench engine": Case(("bench", "engine", "--prompts", "8", "--threads", "1", "--json"), "model"),
    "drift measure": Case(("drift", "measure", "--variant", "fp32", "--threads", "1", "--json"), "model"),
    "status": Case(("status", "JOB", "--json"), elsewhere="tests/infra/test_stack_up.py::test_status_json_is_one_document"),
    "bench sink": Case(("bench", "sink", "--json"), elsewhere="tests/infra/test_bench_pipeline_cli.py (3 s on a real broker)"),
    "bench pipeline": Case(("bench", "pipeline", "--json"), elsewhere="a benchmark: it starts its own stacks (docs/throughput.md)"),
    "bench control": Case(("bench", "control", "--json"),
                          elsewhere="a benchmark: it starts its own control plane and sink on a fake fleet (minutes)"),
    "demo": Case(("demo", "--json"), elsewhere=".ci/run: the main job runs with --json and .ci/check_demo.py parses it"),
}
# commands whose output is always one JSON document (no flag)
ALWAYS_JSON: dict[str, Case] = {
    "sim scenario": Case(("sim", "scenario", "loss", "--workload", "mooncake", "--fleet", "l40s-a10g-t4",
                          "--max-requests", "300", "--policy", "jsq")),
    "sim calibrate": Case(("sim", "calibrate", str(CALIBRATION))),
}


def json_commands() -> set[str]:
    """Every command path of the CLI that takes --json."""
    found: set[str] = set()

    def walk(cmd: object, path: list[str]) -> None:
        if any("--json" in getattr(p, "opts", []) for p in getattr(cmd, "params", [])):
            found.add(" ".join(path))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def run_json(args: tuple[str, ...], env: dict[str, str], timeout_s: float = 600) -> object:
    proc = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}"
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise AssertionError(f"{' '.join(args)}: stdout is not one JSON document ({exc}): {proc.stdout[:500]!r}") from None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_every_json_command_has_a_case() -> None:
    assert json_commands() == set(CASES), "add a case for each new --json command (and drop removed ones)"


def test_machine_output_survives_c_level_chatter_on_stdout(tmp_path: Path) -> None:
    """What json_stdout guards against: a library writing to file descriptor 1 directly (as
    HiGHS does), through C stdio and os.write, and a stray print."""
    script = tmp_path / "chatty.py"
    script.write_text(textwrap.dedent("""
        import ctypes, os
        from phaseroute.cli.common import json_stdout
        with json_stdout() as emit:
            ctypes.CDLL(None).printf(b"HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();\\n")
            os.write(1, b"raw fd 1 chatter\\n")
            print("a stray print")
            emit({"answer": 42})
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"answer": 42}
    for chatter in ("HighsMipSolverData", "raw fd 1 chatter", "a stray print"):
        assert chatter in proc.stderr


@pytest.fixture(scope="module")
def cli_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("json-home")
    real_models = Path(os.environ.get("PHASEROUTE_HOME", Path.home() / ".cache" / "phaseroute")) / "models"
    if real_models.exists():
        (home / "models").symlink_to(real_models)  # the converted model, not a second conversion
    # the query token is this module's: the service, the CLI and the readiness probe all read it here
    return {**os.environ, "PHASEROUTE_HOME": str(home), "PHASEROUTE_TELEMETRY_PORT": str(free_port()),
            "PHASEROUTE_QUERY_TOKEN": secrets.token_urlsafe(24), "COLUMNS": "200"}


@pytest.fixture(scope="module")
def telemetry(cli_env: dict[str, str], bootstrap: str) -> Iterator[dict[str, str]]:
    """A telemetry service of this module's own (state dir, port, consumer group) on the broker."""
    from phaseroute.consumers.query_server import QueryError, remote_query

    env = {**cli_env, "PHASEROUTE_BOOTSTRAP_SERVERS": bootstrap}
    log = open(Path(env["PHASEROUTE_HOME"]) / "telemetry.log", "ab")
    proc = subprocess.Popen([*CLI, "sink", "telemetry", "--group-suffix", f".test-json-{uuid.uuid4().hex[:8]}"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    try:
        while True:
            assert proc.poll() is None, f"the telemetry service exited; see {log.name}"
            try:
                remote_query(int(env["PHASEROUTE_TELEMETRY_PORT"]), "SELECT 1", timeout_s=2,
                             token=env["PHASEROUTE_QUERY_TOKEN"])
                break
            except QueryError as exc:
                assert "token" not in str(exc), f"the telemetry service refused the module's token: {exc}"
                assert time.monotonic() < deadline, "the telemetry service did not answer within 120 s"
                time.sleep(0.5)
        yield env
    finally:  # also when it never answered: no service outlives the module
        proc.terminate()
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, "the telemetry service did not stop cleanly on SIGTERM"


LIGHT = [name for name, case in {**CASES, **ALWAYS_JSON}.items() if case.needs == "" and not case.elsewhere]


@pytest.mark.parametrize("name", LIGHT)
def test_json_without_services(name: str, cli_env: dict[str, str]) -> None:
    case = {**CASES, **ALWAYS_JSON}[name]
    assert isinstance(run_json(case.args, cli_env), (dict, list))


@pytest.mark.kafka
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.needs == "broker"])
def test_json_on_the_broker(name: str, cli_env: dict[str, str], bootstrap: str) -> None:
    env = {**cli_env, "PHASEROUTE_BOOTSTRAP_SERVERS": bootstrap}
    tenant = f"json-{secrets.token_hex(3)}"
    if name == "tenants list":  # the registry may be empty on a fresh broker: the list must show one we add
        added = subprocess.run([*CLI, "tenants", "add", tenant], env=env, capture_output=True, text=True, timeout=120)
        assert added.returncode == 0, added.stderr[-2000:]
    doc = run_json(CASES[name].args, env)
    assert isinstance(doc, (dict, list)) and doc
    if name == "tenants list":
        assert tenant in json.dumps(doc), doc


@pytest.mark.kafka
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.needs == "telemetry"])
def test_json_through_the_telemetry_service(name: str, telemetry: dict[str, str]) -> None:
    doc = run_json(CASES[name].args, telemetry)
    assert isinstance(doc, dict)
    if name == "query":
        assert doc["columns"] == ["one", "two"] and doc["rows"] == [[1, "a"]]
    else:
        assert {"by_variant", "paths", "alerts"} <= set(doc)


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.needs == "model"])
def test_json_of_model_commands(name: str, cli_env: dict[str, str]) -> None:
    doc = run_json(CASES[name].args, cli_env, timeout_s=900)
    assert isinstance(doc, dict)
    if name == "drift measure":
        assert [v["variant"] for v in doc["variants"]] == ["fp32"]
