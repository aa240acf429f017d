"""Each key's rate minute by minute over the last hour, as this process saw it: no writes.

A key's state holds its last 60 seconds and its baseline, not its history, and keeping one
would cost a write per decision. Instead, every listing the admin app makes (the page refreshes
one every few seconds) records each key's 60-second rate under the current calendar minute; the
last sample of a minute stands for it. So the chart of the last hour covers the time this
process has been watching (``since``), and a dashboard left open shows the whole hour.
"""

from __future__ import annotations

import math
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterable

__all__ = ["MINUTES", "MinuteHistory"]

#: Minutes of history kept per key.
MINUTES = 60


class _Ring:
    """One key's minutes: slot ``m % MINUTES`` holds minute ``m`` (or an older one, or -1)."""

    __slots__ = ("minutes", "rates")

    def __init__(self) -> None:
        self.minutes = array("q", [-1] * MINUTES)
        self.rates = array("d", [0.0] * MINUTES)

    def put(self, minute: int, rate: float) -> None:
        if minute >= self.minutes[minute % MINUTES]:
            self.minutes[minute % MINUTES] = minute
            self.rates[minute % MINUTES] = rate

    def last_hour(self, current: int) -> list[tuple[int, float]]:
        kept = zip(self.minutes, self.rates, strict=True)
        return sorted((m, rate) for m, rate in kept if current - MINUTES < m <= current)


def _minute(at: float) -> int:
    return math.floor(at / 60.0)


class MinuteHistory:
    """Per-minute rates of up to ``max_keys`` keys (the most recently seen), for an hour.

    >>> history = MinuteHistory()
    >>> history.observe([("default:3f9a", 1_200.0)], at=1_767_225_600.0)
    >>> history.minutes("default:3f9a", now=1_767_225_630.0)
    [(29453760, 1200.0)]
    """

    def __init__(self, max_keys: int = 10_000) -> None:
        self.max_keys = max_keys
        self.since: float | None = None
        self._rings: OrderedDict[str, _Ring] = OrderedDict()
        self._lock = threading.Lock()

    def observe(self, rates: Iterable[tuple[str, float]], at: float) -> None:
        """Record each ``(store key, rate)`` as the rate of the minute of ``at``."""
        minute = _minute(at)
        with self._lock:
            if self.since is None:
                self.since = at
            for key, rate in rates:
                ring = self._rings.get(key)
                if ring is None:
                    ring = self._rings[key] = _Ring()
                    if len(self._rings) > self.max_keys:
                        self._rings.popitem(last=False)
                else:
                    self._rings.move_to_end(key)
                ring.put(minute, rate)

    def minutes(self, key: str, now: float) -> list[tuple[int, float]]:
        """``(minute, rate)`` of the minutes seen in the hour before ``now``, oldest first; a
        minute is ``floor(epoch seconds / 60)``."""
        with self._lock:
            ring = self._rings.get(key)
            return ring.last_hour(_minute(now)) if ring else []
