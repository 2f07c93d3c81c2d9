"""Engine error types: each names the bad value, and callers branch on the type, not the text.

``retryable`` tells a worker whether the same attempt may succeed elsewhere or later
(a corrupted KV blob can be recomputed by a new prefill; a prompt longer than the model's
context never fits anywhere).
"""

from __future__ import annotations


class EngineError(Exception):
    """Base of every error raised by ``phaseroute.engine``."""

    retryable: bool = False


class KVIntegrityError(EngineError):
    """A KV blob failed its checks (checksum, length, magic, layout): it is never decoded.

    Retryable: the request's prefill can be run again and a fresh blob written.
    """

    retryable = True


class KVNotFoundError(EngineError):
    """No blob at the given store location (expired, never written, or wrong store), or a
    location outside this worker's store, which is never opened."""

    retryable = True


class KVFormatError(EngineError):
    """A KV blob of another model, dtype or layout than this session runs (or whose first token
    disagrees with its own meta): it is never joined. Retryable: another decode pool, or a fresh
    prefill, can run the request."""

    retryable = True


class AdmissionError(EngineError):
    """A request was refused before any work started; the message names the numbers."""


class PromptTooLongError(AdmissionError):
    """prompt tokens + max_tokens exceed the model's context window."""


class KVBudgetError(AdmissionError):
    """The request's KV cache would not fit in the configured KV memory budget."""


class UnknownNameError(EngineError, KeyError):
    """An unknown model, variant or backend name; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class BackendUnavailableError(EngineError):
    """A registered backend cannot run here (its package is not installed, or no such device)."""
