"""Helpers shared by the CLI commands: settings from flags + environment, error reporting,
progress lines, the run-dir record of long-running commands, and stdout kept for JSON."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from phaseroute.config import ConfigError, Settings, load_settings, settings

console = Console(stderr=True)
T = TypeVar("T")


def apply_global_options(bootstrap_servers: str | None, home: str | None) -> None:
    """Flags override the environment for this process and every process it starts."""
    if bootstrap_servers:
        os.environ["PHASEROUTE_BOOTSTRAP_SERVERS"] = bootstrap_servers
    if home:
        os.environ["PHASEROUTE_HOME"] = home
    settings.cache_clear()


def current_settings() -> Settings:
    try:
        return load_settings()
    except ConfigError as exc:
        fail(str(exc))
        raise  # unreachable


def fail(message: str, code: int = 1) -> None:
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)  # a message is text, not markup
    raise typer.Exit(code)


@contextmanager
def errors_as_messages(*kinds: type[BaseException]) -> Iterator[None]:
    """Turn the expected failures of a command into one readable line and a non-zero exit."""
    try:
        yield
    except kinds as exc:
        fail(str(exc))


def run_or_fail(fn: Callable[[], T], *kinds: type[BaseException]) -> T:
    with errors_as_messages(*kinds):
        return fn()
    raise AssertionError("unreachable")  # pragma: no cover


def is_tty() -> bool:
    return sys.stderr.isatty()


def print_table(table: Any, terminal: bool | None = None) -> None:
    """A rich table on stdout, never cut (cells that are plain ``str`` are read as rich markup:
    pass ``rich.text.Text`` for data): on a terminal (``terminal`` None: whether stdout is one)
    cells fold inside columns at least as wide as their headers; into a pipe or a file the table
    is as wide as its content (a console's default 80 columns cut values to 'pha…')."""
    from rich.console import Console

    for column in table.columns:
        column.overflow = "fold"
        column.min_width = max(column.min_width or 0, len(str(column.header)))
    if sys.stdout.isatty() if terminal is None else terminal:
        Console().print(table)
        return
    width = Console(file=sys.stdout, width=100_000, color_system=None).measure(table).maximum
    Console(file=sys.stdout, width=max(width, 20), color_system=None).print(table, highlight=False)


def progress_printer() -> Callable[[str], None]:
    """A function printing ``[  12.3 s] message`` lines on stderr, timed from its creation."""
    started = time.monotonic()

    def say(message: str) -> None:
        console.print(f"[{time.monotonic() - started:6.1f} s] {message}", highlight=False, markup=False, soft_wrap=True)

    return say


F = TypeVar("F", bound=Callable[..., Any])


def long_running(name_of: Callable[[dict[str, Any]], str]) -> Callable[[F], F]:
    """Decorate a command that runs until SIGTERM: it records itself in the run dir when it
    starts, so ``phaseroute down`` stops it also when it was started by hand, and its record
    goes when it exits. ``name_of(kwargs)`` names a process started by hand (the PID is
    appended); one that ``phaseroute up`` started keeps the name ``up`` gave it."""
    from phaseroute.infra import processes

    def wrap(command: F) -> F:
        @functools.wraps(command)
        def registered(*args: Any, **kwargs: Any) -> Any:
            run_dir = current_settings().run_dir
            name = processes.register_self(run_dir, f"{name_of(kwargs)}-{os.getpid()}")
            console.print(f"recorded as {name!r} in {run_dir} (`phaseroute down` stops it)", highlight=False, markup=False, soft_wrap=True)
            return command(*args, **kwargs)

        return registered  # type: ignore[return-value]

    return wrap


def _flush_all() -> None:
    import ctypes

    sys.stdout.flush()
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


@contextmanager
def json_stdout(enabled: bool = True, indent: int | None = None) -> Iterator[Callable[[Any], None]]:
    """Keep stdout for exactly one JSON document: while the block runs, whatever else writes to
    file descriptor 1 (a C library's solver log, a stray print) goes to stderr; ``emit(doc)``
    writes the document to the real stdout. ``enabled=False`` changes nothing (emit prints)."""
    if not enabled:
        yield lambda doc: print(json.dumps(doc, default=str, indent=indent))
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    docs: list[str] = []
    try:
        yield lambda doc: docs.append(json.dumps(doc, default=str, indent=indent))
    finally:
        _flush_all()  # C stdio buffers too, so their chatter lands on stderr and not after the JSON
        os.dup2(saved, 1)
        os.close(saved)
    if len(docs) > 1:
        raise RuntimeError(f"a --json command emitted {len(docs)} documents; it must emit one")
    for doc in docs:
        sys.stdout.write(doc + "\n")
    sys.stdout.flush()
