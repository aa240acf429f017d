"""Both sides: at most one log line a second for what would otherwise be logged per call."""

from __future__ import annotations

from time import monotonic

__all__ = ["Throttle"]


class Throttle:
    """At most one log line per ``interval`` seconds, counting the lines it held back: a
    looping agent in shadow mode must not turn the log into a copy of the access log."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._next = 0.0
        self._held = 0

    def take(self) -> int | None:
        """None: hold this line back. Otherwise log it, with this many held back before it."""
        now = monotonic()
        if now < self._next:
            self._held += 1
            return None
        self._next = now + self.interval
        held, self._held = self._held, 0
        return held
