"""Keep the LP/MILP solver's own printing off standard output.

HiGHS (inside scipy's ``linprog``/``milp``) writes some lines with C ``printf`` whatever its
logging options say (``HighsMipSolverData::transformNewIntegerFeasibleSolution ...`` from the
MIP solver), so ``phaseroute plan --json`` used to print them before its JSON document.
``quiet_solver`` points file descriptor 1 at a temporary log for the length of one solver
call and puts it back afterwards: what the solver printed is kept in the ``SolverLog`` the
block receives (read it when a solve fails), and standard output carries only what
phaseroute writes itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

_MAX_LOG = 20_000


@dataclass
class SolverLog:
    """The last characters the solver printed during the block (filled in when it ends)."""

    text: str = ""

    def tail(self, lines: int = 5) -> str:
        return " | ".join(line for line in self.text.strip().splitlines()[-lines:])


@contextlib.contextmanager
def quiet_solver() -> Iterator[SolverLog]:
    """Redirect fd 1 (C-level stdout) to a temporary file while the block runs."""
    result = SolverLog()
    stdout_fd = 1                  # where C code prints, whatever sys.stdout is
    sys.stdout.flush()
    _flush_c_streams()
    with tempfile.TemporaryFile(mode="w+b") as log:
        saved = os.dup(stdout_fd)
        try:
            os.dup2(log.fileno(), stdout_fd)
            yield result
        finally:
            sys.stdout.flush()
            _flush_c_streams()     # C stdio buffers what it prints to a pipe: empty it into the log
            os.dup2(saved, stdout_fd)
            os.close(saved)
            log.seek(0)
            result.text = log.read()[-_MAX_LOG:].decode("utf-8", "replace")


def _flush_c_streams() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):   # no C library to ask: nothing buffered by C either
        pass
