"""Helpers shared by the CLI commands: settings from flags + environment, error reporting."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import typer
from rich.console import Console

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
    console.print(f"[bold red]error:[/] {message}", highlight=False)
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
