"""``fuse.stats``: how many calls a fuse could not count as reported, readable at any time.

A call whose usage was estimated, unknown or partial is still guarded, but less exactly than
one that reported its usage; a user should be able to see how often that happens long after
the first warning scrolled by. So every such call is counted, for the process and for its key
(the most recently seen keys, bounded), and the warning about it is repeated with the count,
at most once a minute (`report_every`) per kind.

>>> from tokenfuse import Fuse
>>> fuse = Fuse()
>>> fuse.stats.usage
UsageCounts(estimated=0, unknown=0, partial=0)
>>> fuse.stats.usage_of("agent-42").estimated
0
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from ._identity import Identity

__all__ = ["FuseStats", "Outcome", "UsageCounts"]

#: What happened to a call's usage, when it was not read whole from the response.
Outcome = Literal["estimated", "unknown", "partial"]
_OUTCOMES: tuple[Outcome, ...] = ("estimated", "unknown", "partial")


@dataclass(frozen=True, slots=True)
class UsageCounts:
    """Calls whose usage was not read whole from their responses.

    Attributes:
        estimated: no usage was reported; an estimate was recorded (``Usage.estimated``).
        unknown: no usage was reported and none could be estimated (or estimates are off):
            nothing was recorded for the call.
        partial: the response ended early (a stream closed before its end); the usage it had
            reported by then was recorded.
    """

    estimated: int = 0
    unknown: int = 0
    partial: int = 0


class FuseStats:
    """Counters of one fuse (``fuse.stats``), for this process; thread-safe.

    Attributes:
        usage_asked: streaming requests that the transport asked for their usage
            (``stream_options.include_usage``, see ``FuseTransport(inject_usage=...)``).
        usage_option_refused: of those, requests that a server refused because of the option;
            each was sent again as the caller made it, and its host is no longer asked.

    Args:
        max_keys: how many keys keep counts of their own (the most recently counted ones).
        report_every: seconds between two log lines (and events) of the same kind.
        clock: monotonic seconds, for the reports' pace.
    """

    def __init__(
        self,
        *,
        max_keys: int = 1024,
        report_every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_keys = max_keys
        self.report_every = report_every
        self._clock = clock
        self._lock = threading.Lock()
        self._totals = dict.fromkeys(_OUTCOMES, 0)
        self._keys: dict[Identity, dict[Outcome, int]] = {}
        self._reported: dict[Outcome, tuple[float, int]] = {}  # when, and the total then
        self.usage_asked = 0
        self.usage_option_refused = 0

    @property
    def usage(self) -> UsageCounts:
        """The counts of every key together, since the fuse was made."""
        with self._lock:
            return UsageCounts(**self._totals)

    def usage_of(self, who: str | Identity) -> UsageCounts:
        """The counts of one key (zeros for a key not counted lately)."""
        counts = self._keys.get(Identity.of(who))
        if counts is None:
            return UsageCounts()
        with self._lock:
            return UsageCounts(**counts)

    def count(self, identity: Identity, outcome: Outcome) -> tuple[int, int] | None:
        """Count one call; when a report of this kind is due, the total and how many calls
        were counted since the last report (the first call of a kind is reported at once)."""
        with self._lock:
            self._totals[outcome] += 1
            total = self._totals[outcome]
            counts = self._keys.pop(identity, None)  # re-inserted last: most recent
            if counts is None:
                counts = dict.fromkeys(_OUTCOMES, 0)
                if len(self._keys) >= self.max_keys:
                    del self._keys[next(iter(self._keys))]  # the least recently counted key
            counts[outcome] += 1
            self._keys[identity] = counts
            now = self._clock()
            last = self._reported.get(outcome)
            if last is not None and now - last[0] < self.report_every:
                return None
            self._reported[outcome] = (now, total)
            return total, total - (last[1] if last is not None else 0)

    def asked(self) -> None:
        """One streaming request was asked for its usage."""
        with self._lock:
            self.usage_asked += 1

    def option_refused(self) -> int:
        """A server refused the usage option; returns how many times this happened."""
        with self._lock:
            self.usage_option_refused += 1
            return self.usage_option_refused
