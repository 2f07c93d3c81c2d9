"""Every ``--json`` of ``phaseroute sim`` and ``phaseroute plan`` writes exactly one JSON document to stdout.

The commands run in this process through the real CLI app; ``capfd`` captures file descriptor
1 itself, so a line the LP solver prints from C (as HiGHS's MIP solver did before the JSON
of ``phaseroute plan --json``) would land in the captured output and fail ``json.loads``.
"""

from __future__ import annotations

import ctypes
import json
import os

import pytest

from phaseroute.cli.main import app
from phaseroute.sim.solver_io import quiet_solver
from phaseroute.sim.specio import DATA_DIR


def test_quiet_solver_keeps_c_level_printing_off_stdout(capfd):
    print("before", flush=True)
    with quiet_solver() as log:
        ctypes.CDLL(None).printf(b"HighsMipSolverData::transformNewIntegerFeasibleSolution tmpSolver.run();\n")
        os.write(1, b"raw fd write\n")
    print("after", flush=True)
    assert capfd.readouterr().out == "before\nafter\n"
    assert "transformNewIntegerFeasibleSolution" in log.text and "raw fd write" in log.text


@pytest.fixture()
def specs(sim_inputs, tmp_path):
    w, f, c = tmp_path / "w.json", tmp_path / "f.json", tmp_path / "c.yaml"
    w.write_text(json.dumps(sim_inputs.workload(max_requests=400)))
    f.write_text(json.dumps(sim_inputs.fleet()))
    c.write_text("candidates: [L4, A10G]\n")
    return {"w": str(w), "f": str(f), "c": str(c), "cal": str(DATA_DIR / "calibration-cpu-smollm2.yaml")}


COMMANDS = {
    "sim": "sim -w {w} -f {f} --load 0.7 --policy jsq,phaseroute --json",
    "capacity": "sim capacity -w {w} -f {f} --policy jsq --seeds 1 --tolerance 0.5 --max-load 1.5 --json",
    "bench-bound": "sim bench-bound -w {w} -f {f} --jobs 20 --no-slowdown --json",
    "scenario stale": "sim scenario stale -w {w} -f {f} --policy jsq --no-bound",
    "scenario loss": "sim scenario loss -w {w} -f {f} --policy jsq",
    "scenario transfer": "sim scenario transfer -w {w} -f {f} --policy jsq --usd-per-gb 0.05",
    "bench": "sim bench -w {w} -f {f} --policy jsq --max-requests 300 --json",
    "calibrate": "sim calibrate {cal}",
    "plan": "plan -w {w} -c {c} --policy jsq --confirm 1 --json",
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_json_output_is_one_document(name, specs, capfd):
    app(COMMANDS[name].format(**specs).split(), standalone_mode=False)
    out = capfd.readouterr().out
    doc = json.loads(out)                      # fails at the first character if anything else is printed
    assert isinstance(doc, dict) and doc, name
