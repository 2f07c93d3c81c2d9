"""Errors the simulator raises on bad input; each message names the file, field and value."""

from __future__ import annotations


class SimError(ValueError):
    """Base class: a simulator input phaseroute cannot use."""


class TraceError(SimError):
    """A trace file is unreadable or malformed (the message names file, line and value)."""


class SpecError(SimError):
    """A workload, fleet or catalogue spec is invalid (the message names file and field)."""
