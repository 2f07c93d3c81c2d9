"""``Authorization: Bearer <key>`` on every route, checked against the tenant registry.

A missing, unknown or revoked key is a 401. Failed attempts are counted per client address
in a sliding window: past ``max_failures`` in ``window_s`` the address gets 429 with
``Retry-After`` until the window clears, even with a good key (so guessing is slow). The
counter is per API process (each instance limits on its own).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from fastapi import Request

from phaseroute.api.errors import ApiError


class FailureLimiter:
    def __init__(self, max_failures: int = 10, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_failures, self.window_s, self.clock = max_failures, window_s, clock
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._failures.setdefault(client, deque())
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return times

    def retry_after(self, client: str) -> float | None:
        """Seconds until ``client`` may try again, or None when it is not blocked."""
        now = self.clock()
        with self._lock:
            times = self._recent(client, now)
            if len(times) < self.max_failures:
                if not times:
                    self._failures.pop(client, None)
                return None
            return max(0.0, times[0] + self.window_s - now)

    def failed(self, client: str) -> None:
        now = self.clock()
        with self._lock:
            self._recent(client, now).append(now)


def bearer_key(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    return key.strip() or None if scheme.lower() == "bearer" else None


def authenticate(request: Request) -> str:
    """The tenant of the request's key (a FastAPI dependency); ApiError 401/429 otherwise."""
    state = request.app.state
    client = request.client.host if request.client else "unknown"
    wait = state.limiter.retry_after(client)
    if wait is not None:
        raise ApiError(429, f"too many failed authentications from {client}; retry in {wait:.0f} s",
                       "rate_limit_exceeded", headers={"Retry-After": str(max(1, int(wait + 0.999)))})
    key = bearer_key(request)
    tenant: str | None = state.registry.authenticate(key) if key else None
    if tenant is None:
        state.limiter.failed(client)
        message = ("no API key given: send 'Authorization: Bearer <key>' (keys are made by `phaseroute tenants add`)"
                   if key is None else "the API key is not valid (unknown or revoked)")
        raise ApiError(401, message, "invalid_api_key")
    return tenant
