"""Store health: fail open without paying a dead store's timeout on every call.

After ``threshold`` consecutive failures the store is skipped for a back-off period that
doubles on each further failure (capped); the first call after the period probes it again.
A warning is logged at most once per ``log_every`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["StoreHealth"]


class StoreHealth:
    """How a ``Fuse`` backs off a failing store (``Fuse(health=...)``).

    >>> health = StoreHealth(threshold=5, backoff_max=10.0)
    """

    def __init__(
        self,
        *,
        threshold: int = 3,
        backoff: float = 1.0,
        backoff_max: float = 30.0,
        log_every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = threshold
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.log_every = log_every
        self._clock = clock
        self._failures = 0
        self._skip_until = 0.0
        self._next_log = 0.0

    def available(self) -> bool:
        """False while the store is being skipped after repeated failures."""
        return self._failures < self.threshold or self._clock() >= self._skip_until

    def failed(self) -> bool:
        """Count a failure; True when this one should be logged (rate-limited)."""
        self._failures += 1
        now = self._clock()
        if self._failures >= self.threshold:
            extra = self._failures - self.threshold
            self._skip_until = now + min(self.backoff * 2.0 ** min(extra, 16), self.backoff_max)
        if now >= self._next_log:
            self._next_log = now + self.log_every
            return True
        return False

    def succeeded(self) -> bool:
        """Reset the count; True when this ends an outage (worth an event)."""
        recovered = self._failures > 0
        self._failures = 0
        self._skip_until = 0.0
        return recovered
