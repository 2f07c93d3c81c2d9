"""The tokens each tenant was released in a recent window: what a share cap reads.

The fair scheduler's weights order tenants while they wait; they bound nobody's share of the
work already running. A tenant with a share cap (the drift monitor's canaries) may be released
a request only while its tokens stay within that share of all tokens released in the window,
so its share holds whether or not anybody else still waits in a queue.

Pure: time is passed in. A release given back (``remove``) leaves the window at once; a
request released again (a retry) is counted again, as the fleet runs it again.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class ShareWindow:
    """Tokens released per tenant since the oldest release not yet expired, and their total."""

    _order: deque[tuple[float, str]] = field(default_factory=deque)  # (released at, request id), oldest first
    _live: dict[str, tuple[float, str, float]] = field(default_factory=dict)  # request id -> (at, tenant, tokens)
    _per_tenant: dict[str, float] = field(default_factory=dict)
    total: float = 0.0

    def add(self, request_id: str, tenant: str, tokens: float, now: float) -> None:
        self.remove(request_id)
        self._order.append((now, request_id))
        self._live[request_id] = (now, tenant, tokens)
        self._per_tenant[tenant] = self._per_tenant.get(tenant, 0.0) + tokens
        self.total += tokens

    def remove(self, request_id: str) -> None:
        """Take a release back out (it did not run); unknown or already expired ids are ignored."""
        entry = self._live.pop(request_id, None)
        if entry is not None:
            _, tenant, tokens = entry
            self._per_tenant[tenant] -= tokens
            self.total -= tokens

    def expire(self, oldest: float) -> None:
        """Forget releases made before ``oldest`` (now minus the window)."""
        while self._order and self._order[0][0] < oldest:
            at, request_id = self._order.popleft()
            entry = self._live.get(request_id)
            if entry is not None and entry[0] == at:  # not since released again
                self.remove(request_id)
        if not self._live:  # no float residue once empty
            self._per_tenant.clear()
            self.total = 0.0

    def tokens(self, tenant: str) -> float:
        return max(0.0, self._per_tenant.get(tenant, 0.0))

    def room(self, tenant: str, share: float) -> float:
        """Tokens ``tenant`` may still be released now and stay within ``share`` of the window's
        tokens, counting its own new ones: c <= (share * total - mine) / (1 - share)."""
        if share >= 1.0:
            return math.inf
        return max(0.0, (share * self.total - self.tokens(tenant)) / (1.0 - share))
