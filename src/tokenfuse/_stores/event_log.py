"""The events operators need, kept by the store so that every process sharing it sees them.

A ``Fuse`` hands each of its events (trips, near-limit episodes, resets, live configuration,
store outages) to its store's ``events`` log, if the store keeps one: ``RedisStore`` keeps a
capped Redis Stream (``redis_events``), ``MemoryStore`` a ring buffer in this process. Events
are rare, so the log costs nothing per decision: only the decision that trips writes one.

The log also remembers the *label* of each key it has had an event about (``sk-…9c21``, a
name), as the store itself keeps only hashes: that is how an admin page can show a label next
to a key id. Only labels are kept, never a credential: an identity's label is already its
redaction.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Protocol, runtime_checkable

from .._events import FuseEvent, Hook

__all__ = [
    "LABELLED_KINDS",
    "OUTAGE_KINDS",
    "EventLog",
    "LoggedEvent",
    "MemoryEventLog",
    "origin",
]

#: Events about a key that teach the log its label.
LABELLED_KINDS = frozenset({"tripped", "near_limit", "reset", "configured", "forgiven"})
#: Events about the store itself: not written while it fails, but with the next event after.
OUTAGE_KINDS = frozenset({"store_unavailable", "pool_exhausted"})

_NUMBERS = ("rate", "limit", "baseline", "multiple", "retry_after")


def origin() -> str:
    """Which process an event comes from: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class LoggedEvent:
    """One event as the log keeps it: a ``FuseEvent`` with the fuse it came from, the key's
    id, the process, and the refusal's numbers for a trip. ``id`` orders events within a log
    (a Redis Stream entry id, or a sequence number)."""

    id: str
    kind: str
    fuse: str
    label: str | None
    key_id: str | None
    detail: str
    at: float
    origin: str
    reason: str | None = None
    rate: float | None = None
    limit: float | None = None
    baseline: float | None = None
    multiple: float | None = None
    retry_after: float | None = None

    @classmethod
    def of(cls, event: FuseEvent, fuse: str, id: str = "") -> LoggedEvent:
        error = event.error
        numbers = {name: getattr(error, name, None) for name in _NUMBERS} if error else {}
        return cls(
            id=id,
            kind=event.kind,
            fuse=event.fuse or fuse,
            label=event.key,
            key_id=event.key_id,
            detail=event.detail,
            at=event.at,
            origin=origin(),
            reason=getattr(error, "reason", None) if error else None,
            **numbers,
        )

    def fields(self) -> dict[str, str]:
        """The event as text fields (a stream entry's): None fields are left out."""
        return {
            name: repr(value) if isinstance(value, float) else str(value)
            for name, value in asdict(self).items()
            if value is not None and name != "id"
        }

    @classmethod
    def from_fields(cls, id: str, fields: Mapping[str, str]) -> LoggedEvent:
        """The event from its text fields; a malformed number reads as None."""
        numbers = {name: _number(fields.get(name)) for name in _NUMBERS}
        return cls(
            id=id,
            kind=fields.get("kind", "unknown"),
            fuse=fields.get("fuse", ""),
            label=fields.get("label"),
            key_id=fields.get("key_id"),
            detail=fields.get("detail", ""),
            at=_number(fields.get("at")) or 0.0,
            origin=fields.get("origin", ""),
            reason=fields.get("reason"),
            **numbers,
        )

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    def event(self) -> FuseEvent:
        """The ``FuseEvent`` logged (its refusal as text only: ``detail``)."""
        return FuseEvent(
            self.kind,  # type: ignore[arg-type]  # a kind of a newer version reads as is
            self.label,
            self.detail,
            at=self.at,
            key_id=self.key_id,
            fuse=self.fuse,
        )


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value == value and abs(value) != float("inf") else None


@runtime_checkable
class EventLog(Protocol):
    """Where a store keeps operator events, and how the admin and the CLI read them."""

    def recorder(self, fuse: str) -> Hook:
        """The hook that logs the events of the fuse named ``fuse``."""
        ...

    def recent(self, count: int) -> list[LoggedEvent]:
        """The newest ``count`` events, oldest first."""
        ...

    async def arecent(self, count: int) -> list[LoggedEvent]: ...

    def since(self, start: float, count: int) -> list[LoggedEvent]:
        """Events at or after ``start`` (epoch seconds), oldest first, at most ``count``."""
        ...

    async def asince(self, start: float, count: int) -> list[LoggedEvent]: ...

    def read(self, after: str, count: int, block: float) -> list[LoggedEvent]:
        """Events after the one with id ``after`` ("" or "0": from the oldest kept), waiting
        up to ``block`` seconds for one to arrive."""
        ...

    async def aread(self, after: str, count: int, block: float) -> list[LoggedEvent]: ...

    def labels(self, fuse: str, key_ids: Sequence[str]) -> dict[str, str]:
        """The labels known for these key ids of ``fuse`` (ids without one are left out)."""
        ...

    async def alabels(self, fuse: str, key_ids: Sequence[str]) -> dict[str, str]: ...


class MemoryEventLog:
    """The log of a ``MemoryStore``: the last ``size`` events and the labels of the last
    ``labels`` keys, in this process.

    >>> log = MemoryEventLog()
    >>> log.recent(10)
    []
    """

    def __init__(self, size: int = 1_000, labels: int = 10_000) -> None:
        self._events: deque[LoggedEvent] = deque(maxlen=size)
        self._labels: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._max_labels = labels
        self._sequence = itertools.count(1)
        self._changed = threading.Condition()

    def recorder(self, fuse: str) -> Hook:
        return partial(self.append, fuse=fuse)

    def append(self, event: FuseEvent, fuse: str) -> None:
        with self._changed:
            self._events.append(LoggedEvent.of(event, fuse, str(next(self._sequence))))
            remember_label(event, fuse, self._labels.__setitem__)
            while len(self._labels) > self._max_labels:
                self._labels.popitem(last=False)
            self._changed.notify_all()

    def recent(self, count: int) -> list[LoggedEvent]:
        with self._changed:
            return list(self._events)[-count:] if count > 0 else []

    async def arecent(self, count: int) -> list[LoggedEvent]:
        return self.recent(count)

    def since(self, start: float, count: int) -> list[LoggedEvent]:
        with self._changed:
            return [event for event in self._events if event.at >= start][:count]

    async def asince(self, start: float, count: int) -> list[LoggedEvent]:
        return self.since(start, count)

    def _after(self, after: str, count: int) -> list[LoggedEvent]:
        last = int(after) if after.isdigit() else 0
        return [event for event in self._events if int(event.id) > last][:count]

    def read(self, after: str, count: int, block: float) -> list[LoggedEvent]:
        with self._changed:
            self._changed.wait_for(lambda: self._after(after, 1), timeout=max(block, 0.0))
            return self._after(after, count)

    async def aread(self, after: str, count: int, block: float) -> list[LoggedEvent]:
        # Appends come from any thread, so there is no loop-bound signal to await: look
        # every 50 ms until the deadline (in-process, it costs next to nothing).
        deadline = time.monotonic() + max(block, 0.0)
        while True:
            with self._changed:
                found = self._after(after, count)
            if found or time.monotonic() >= deadline:
                return found
            await asyncio.sleep(min(0.05, max(deadline - time.monotonic(), 0.0)))

    def labels(self, fuse: str, key_ids: Sequence[str]) -> dict[str, str]:
        with self._changed:
            known = ((key_id, self._labels.get((fuse, key_id))) for key_id in key_ids)
            return {key_id: label for key_id, label in known if label is not None}

    async def alabels(self, fuse: str, key_ids: Sequence[str]) -> dict[str, str]:
        return self.labels(fuse, key_ids)


def remember_label(
    event: FuseEvent, fuse: str, remember: Callable[[tuple[str, str], str], object]
) -> None:
    """Pass an event's (fuse, key id) and label to ``remember`` when it teaches one: a key
    event whose label is more than the id itself (what a key addressed by id alone shows)."""
    if event.kind in LABELLED_KINDS and event.key and event.key_id and event.key != event.key_id:
        remember((event.fuse or fuse, event.key_id), event.key)
