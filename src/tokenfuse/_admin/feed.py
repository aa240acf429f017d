"""Where operators read events from: an ``EventFeed``.

``StoreFeed`` reads the event log a store keeps (``store.events``: a Redis Stream every process
writes its operator events to, or a ``MemoryStore``'s ring). ``LocalEvents`` keeps the latest
events of this process's fuses (``listen``) in a ring, for a store that keeps no log. Another
feed plugs in with ``add_feed_source``: ``feed_for(store)`` asks each source in turn, then the
store, then falls back to the local one. ``cross_process`` says which one it got.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

from .._events import FuseEvent, listen
from .._stores.event_log import EventLog, MemoryEventLog

__all__ = [
    "EventFeed",
    "LocalEvents",
    "StoreFeed",
    "add_feed_source",
    "feed_for",
    "local_events",
]


class EventFeed(Protocol):
    """Events as an operator reads them: the latest ones, then each new one as it comes."""

    cross_process: bool
    """Whether the feed has the events of every process sharing the store, or this one's."""

    def recent(self, limit: int = 100) -> list[FuseEvent]:
        """The latest events, oldest first."""
        ...

    def follow(self, stop: threading.Event, poll: float = 1.0) -> Iterator[FuseEvent]:
        """Each event that comes after the call, as it comes, until ``stop`` is set (checked
        at least every ``poll`` seconds)."""
        ...


class LocalEvents:
    """The last ``size`` events of every fuse in this process, in a ring.

    >>> feed = LocalEvents()
    >>> feed.recent()
    []
    >>> feed.close()
    """

    cross_process = False

    def __init__(self, size: int = 1_000) -> None:
        self._events: deque[tuple[int, FuseEvent]] = deque(maxlen=size)
        self._count = 0
        self._changed = threading.Condition()
        self._stop_listening = listen(self._add)

    def _add(self, event: FuseEvent) -> None:
        with self._changed:
            self._count += 1
            self._events.append((self._count, event))
            self._changed.notify_all()

    def recent(self, limit: int = 100) -> list[FuseEvent]:
        with self._changed:
            kept = list(self._events)
        return [event for _, event in kept[-limit:]] if limit > 0 else []

    def follow(self, stop: threading.Event, poll: float = 1.0) -> Iterator[FuseEvent]:
        with self._changed:
            seen = self._count
        while not stop.is_set():
            with self._changed:
                if self._count == seen:
                    self._changed.wait(poll)
                new = [event for number, event in self._events if number > seen]
                seen = self._count
            yield from new

    def close(self) -> None:
        """Stop collecting events."""
        self._stop_listening()


class StoreFeed:
    """The events of a store's own log (``store.events``): every process's, when the store is
    shared (Redis), as ``FuseEvent`` values (a logged trip keeps its message, not its error).

    >>> feed = StoreFeed(MemoryStore().events)
    >>> feed.recent()
    []
    """

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.cross_process = not isinstance(log, MemoryEventLog)

    def recent(self, limit: int = 100) -> list[FuseEvent]:
        return [logged.event() for logged in self.log.recent(limit)]

    def follow(self, stop: threading.Event, poll: float = 1.0) -> Iterator[FuseEvent]:
        newest = self.log.recent(1)
        after = newest[-1].id if newest else ""
        while not stop.is_set():
            for logged in self.log.read(after, 100, block=poll):
                after = logged.id
                yield logged.event()


FeedSource = Callable[[object], EventFeed | None]

_sources: list[FeedSource] = []
_local: LocalEvents | None = None
_lock = threading.Lock()


def add_feed_source(source: FeedSource) -> None:
    """Offer feeds: ``source(store)`` returns a feed of that store's events, or None."""
    with _lock:
        _sources.insert(0, source)  # the latest added is asked first


def local_events() -> LocalEvents:
    """This process's feed, started at first use."""
    global _local
    with _lock:
        if _local is None:
            _local = LocalEvents()
        return _local


def feed_for(store: object) -> EventFeed:
    """The best feed of ``store``'s events: one a source offers, else the store's own log,
    else this process's events."""
    with _lock:
        sources = list(_sources)
    for source in sources:
        feed = source(store)
        if feed is not None:
            return feed
    log = getattr(store, "events", None)
    return StoreFeed(log) if isinstance(log, EventLog) else local_events()
