"""Store health: fail open without paying a dead store's timeout on every call, tell an
outage from back-pressure, and come back soon after the store does.

* **Outage.** After ``threshold`` consecutive failures, and no success for
  ``answered_within`` seconds (1 s), the store is skipped for a back-off period that
  doubles on each further failure, capped at ``backoff_max`` (5 s); the first call after
  the period probes the store. So a dead store costs one probe per 5 s at most, and
  enforcement resumes at most 5 s (plus one probe) after the store is back.
* **Partial outage.** A store that still answers some calls is not skipped: in a Redis
  Cluster with one dead primary, the keys on the live nodes keep being enforced while the
  keys on the dead one fail open, each paying its own failure. (Failures in a row come by
  chance there: with a third of the keys on a dead node, one decision in 27 ends a run of
  three.)
* **Back-pressure.** ``StoreBusy`` (the store answers, but no pooled connection came free
  within the wait) is counted as ``pool_exhausted``, reported as its own event and never
  moves the back-off: the server is fine, this process is busy.
* **Events.** ``store_unavailable`` and ``pool_exhausted`` are emitted (and logged) at most
  once per ``log_every`` seconds each, so a long outage is reported again every minute;
  ``store_recovered`` only ends an outage that was reported, once: a store that flaps, or a
  cluster with one dead node (keys on it fail, others succeed), pages once, not per success.

``counts`` keeps the totals, for a status page or a metrics exporter to read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ._errors import StoreBusy
from ._events import FuseEvent

__all__ = ["HealthCounts", "StoreHealth"]


@dataclass(slots=True)
class HealthCounts:
    """Totals since the fuse was made: decisions that did not get a verdict from the store,
    by cause, and the outages reported.

    >>> StoreHealth().counts.pool_exhausted
    0
    """

    failed: int = 0  # the store raised (an outage, or the start of one)
    skipped: int = 0  # not asked: the store was being skipped after repeated failures
    pool_exhausted: int = 0  # no free connection within the wait: back-pressure
    outages: int = 0  # outages reported (store_unavailable; a long one repeats it, once)
    recoveries: int = 0  # store_recovered events: one per reported outage that ended


class StoreHealth:
    """How a ``Fuse`` backs off a failing store (``Fuse(health=...)``), what it reports
    about it, and the counts.

    >>> health = StoreHealth(backoff_max=5.0)    # the defaults: 3 failures, 1 s, 5 s, 1 s
    >>> fuse = Fuse(store, health=health)         # doctest: +SKIP
    >>> health.counts.pool_exhausted              # read by a status page or an exporter
    0

    Args:
        threshold: failures in a row before the store may be skipped.
        backoff: the first skip period; it doubles with each further failure.
        backoff_max: the longest skip period: how late enforcement may resume.
        answered_within: a store that answered any call this recently is partly up (a
            cluster with one dead node) and is not skipped.
        log_every: the least seconds between two events (and log lines) of one kind.
        clock: monotonic seconds (tests inject one).
    """

    def __init__(
        self,
        *,
        threshold: int = 3,
        backoff: float = 1.0,
        backoff_max: float = 5.0,
        answered_within: float = 1.0,
        log_every: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = threshold
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.answered_within = answered_within
        self.log_every = log_every
        self.counts = HealthCounts()
        self._clock = clock
        self._failures = 0
        self._skip_until = 0.0
        self._answered = False  # a call succeeded since the last failure
        self._last_answer = float("-inf")  # about when, as of the failure after it
        self._announced = False  # a store_unavailable was emitted and not yet recovered
        self._next_log = {"store_unavailable": 0.0, "pool_exhausted": 0.0}

    def available(self) -> bool:
        """False while the store is being skipped after repeated failures."""
        if self._failures < self.threshold or self._clock() >= self._skip_until:
            return True
        self.counts.skipped += 1
        return False

    def failed(self, exc: BaseException, *, fail_closed: bool = False) -> FuseEvent | None:
        """Count a failed store call; the event to report, when one is due (rate-limited)."""
        failing = "closed" if fail_closed else "open"
        if isinstance(exc, StoreBusy):
            self.counts.pool_exhausted += 1
            detail = f"no free store connection in time (back-pressure), failing {failing}: {exc}"
            return self._due(FuseEvent("pool_exhausted", None, detail))
        self.counts.failed += 1
        self._failures += 1
        now = self._clock()
        if self._answered:
            self._answered, self._last_answer = False, now
        if self._failures >= self.threshold and now - self._last_answer >= self.answered_within:
            extra = self._failures - self.threshold
            self._skip_until = now + min(self.backoff * 2.0 ** min(extra, 16), self.backoff_max)
        event = self._due(FuseEvent("store_unavailable", None, f"store unavailable, failing "
                                    f"{failing}: {exc}"))  # fmt: skip
        if event is not None and not self._announced:
            self._announced = True
            self.counts.outages += 1
        return event

    def succeeded(self) -> FuseEvent | None:
        """The store answered: end the outage; ``store_recovered`` if one was reported."""
        self._answered = True
        if not self._failures and not self._announced:
            return None  # the common case, kept cheap: it runs on every decision
        self._failures = 0
        self._skip_until = 0.0
        if not self._announced:
            return None
        self._announced = False
        self.counts.recoveries += 1
        return FuseEvent("store_recovered", None, "store answers again")

    def _due(self, event: FuseEvent) -> FuseEvent | None:
        now = self._clock()
        if now < self._next_log[event.kind]:
            return None
        self._next_log[event.kind] = now + self.log_every
        return event
