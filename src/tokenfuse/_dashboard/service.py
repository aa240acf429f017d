"""What the admin page asks of one fuse, on ``tokenfuse.admin.Admin``: the key table (open
keys first, filtered and paged), one key in detail, and the live changes.

``Admin`` lists, finds, resets and reconfigures keys, as the CLI does; ``Panel`` adds what a
page needs besides: a key's window slot by slot and its last trip (``ReadState``), its rate
minute by minute over the last hour as this process saw it (``MinuteHistory``), and its events
of the hour from the store's event log. Everything here is sync, as ``Admin`` is: the app runs
it in a worker thread.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .._admin.refs import KeyRef
from .._admin.service import Admin
from .._admin.views import SORTS, KeyView
from .._core.velocity import REASON_CODES, SLOT_SECONDS, SLOTS, VelocityState
from .._errors import ConfigurationError
from .._fuse import Fuse
from .._stores.base import sync_face
from .._stores.event_log import EventLog, LoggedEvent, MemoryEventLog
from .._stores.ops import UNSET, ReadState, StoredState, Unset
from .history import MinuteHistory

__all__ = ["SORTS", "KeyDetail", "Listing", "Panel", "Slot", "event_log", "window_of"]

State = Literal["all", "open", "near", "ok", "idle"]
By = Literal["auto", "id", "name"]

_HOUR = 3_600.0


@dataclass(frozen=True, slots=True)
class Slot:
    """One 5-second slot of the key's 60-second window."""

    start: float
    amount: float
    largest: float


@dataclass(frozen=True, slots=True)
class Listing:
    """A page of the key table, open keys first; ``total`` keys matched the filters."""

    keys: list[KeyView]
    total: int
    at: float

    def to_json(self) -> dict[str, Any]:
        keys = [_finite(view.as_dict()) for view in self.keys]
        return {"keys": keys, "total": self.total, "at": self.at}


@dataclass(frozen=True, slots=True)
class KeyDetail:
    """One key in full: its view; its last trip; its 60-second window slot by slot; its rate
    minute by minute over the last hour as this process saw it (since ``history_since``); and
    its events of the last hour from the store's event log."""

    key: KeyView
    window: list[Slot]
    minutes: list[tuple[int, float]]
    history_since: float | None
    trip_reason: str | None = None
    last_trip: float | None = None
    strikes: int = 0
    events: list[LoggedEvent] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": _finite(self.key.as_dict()),
            "trip_reason": self.trip_reason,
            "last_trip": self.last_trip,
            "strikes": self.strikes,
            "window": [asdict(slot) for slot in self.window],
            "minutes": [{"minute": m, "rate": rate} for m, rate in self.minutes],
            "history_since": self.history_since,
            "events": [event.to_json() for event in self.events],
        }


def _finite(values: dict[str, Any]) -> dict[str, Any]:
    """JSON has no NaN or infinity: such a number is unknown, None."""
    return {
        name: None if isinstance(value, float) and not math.isfinite(value) else value
        for name, value in values.items()
    }


def event_log(fuse: Fuse) -> EventLog:
    """The log of the fuse's store; a fuse on a store that keeps none gets one in this process
    (from now on)."""
    log = getattr(fuse.store, "events", None)
    if isinstance(log, EventLog):
        return log
    found: EventLog | None = getattr(fuse, "_panel_events", None)
    if found is None:
        found = MemoryEventLog()
        fuse.on_event(found.recorder(fuse.name))
        fuse._panel_events = found  # type: ignore[attr-defined]
    return found


def key_ref(ref: str | KeyRef, by: By = "auto") -> KeyRef:
    """What ``ref`` names: ``by="id"`` a key id (or its start), ``"name"`` a name, ``"auto"``
    either, as ``KeyRef.parse`` reads it (never a credential)."""
    if not isinstance(ref, str):
        return ref
    if by == "id":
        return KeyRef.key_id(ref)
    if by == "name":
        return KeyRef.name(ref)
    if by == "auto":
        return KeyRef.parse(ref)
    raise ConfigurationError(f"by must be auto, id or name, not {by!r}")


class Panel:
    """The keys of one ``Fuse`` as the admin page shows them.

    >>> panel = Panel(Fuse())                                     # doctest: +SKIP
    >>> [view.key_id for view in panel.keys(state="open").keys]   # doctest: +SKIP
    ['3f9a0c12ab45']
    """

    #: The most events a detail looks through for the key's own.
    events_searched = 10_000

    def __init__(self, fuse: Fuse, *, history: MinuteHistory | None = None) -> None:
        self.fuse = fuse
        self.events = event_log(fuse)
        self.admin = Admin(fuse)
        self.history = history or MinuteHistory()

    def keys(
        self,
        *,
        state: State = "all",
        sort: str = "state",
        search: str = "",
        limit: int = 50,
        offset: int = 0,
    ) -> Listing:
        """The table: open keys first, then by ``sort`` (``Admin.keys``); only keys in
        ``state``, and with ``search`` the keys whose id starts with it or whose label holds
        it (in any case)."""
        if state not in ("all", "open", "near", "ok", "idle"):
            raise ConfigurationError(f"state must be all, open, near, ok or idle, not {state!r}")
        views = self.admin.keys(sort=sort)
        views.sort(key=lambda view: view.state != "open")  # stable: the order within stays
        at = time.time()
        self.history.observe(((view.status.key, view.status.rate) for view in views), at)
        search = search.strip().lower()
        wanted = [view for view in views if _matches(view, state, search)]
        start = max(offset, 0)
        return Listing(wanted[start : start + max(limit, 0)], len(wanted), at)

    def detail(self, ref: str | KeyRef, *, by: By = "auto") -> KeyDetail:
        """One key in full (``KeyNotFound`` if the store holds nothing for it)."""
        [view] = self.admin.find(key_ref(ref, by), fuse=self.fuse.name)
        store = sync_face(self.fuse.store)
        if store is None:
            raise ConfigurationError(f"{self.fuse.store!r} is async-only: the admin needs sync")
        state: StoredState = store.run(ReadState(view.status.key))
        self.history.observe([(view.status.key, view.status.rate)], time.time())
        logged = self.events.since(state.now - _HOUR, self.events_searched)
        mine = [e for e in logged if e.key_id == view.key_id and e.fuse == self.fuse.name]
        velocity = state.velocity
        tripped = velocity is not None and velocity.last_trip > 0
        return KeyDetail(
            key=view,
            window=window_of(velocity, state.now),
            minutes=self.history.minutes(view.status.key, time.time()),
            history_since=self.history.since,
            trip_reason=REASON_CODES.get(velocity.trip_reason) if velocity and tripped else None,
            last_trip=velocity.last_trip if velocity and tripped else None,
            strikes=velocity.strikes if velocity else 0,
            events=mine,
        )

    # -- live changes (``Admin``'s): every process sharing the store sees them -----------------

    def reset(self, ref: str | KeyRef, *, by: By = "auto") -> KeyView:
        """Close the key at once, clear its window and escalation."""
        [view] = self.admin.reset(key_ref(ref, by), fuse=self.fuse.name)
        return view

    def forgive(self, ref: str | KeyRef, *, by: By = "auto") -> KeyView:
        """``Fuse.forgive``, where this version has it (``NotAvailable`` otherwise)."""
        [view] = self.admin.forgive(key_ref(ref, by), fuse=self.fuse.name)
        return view

    def set_limit(
        self, ref: str | KeyRef, limit: float | str | None, *, by: By = "auto"
    ) -> KeyView:
        """The key's manual ceiling per minute (``"50k/min"`` too); None clears it."""
        return self.admin.set_limit(key_ref(ref, by), limit, fuse=self.fuse.name)

    def set_bucket(
        self,
        ref: str | KeyRef,
        *,
        rate: float | str | None | Unset = UNSET,
        capacity: float | None | Unset = UNSET,
        by: By = "auto",
    ) -> KeyView:
        """The key's bucket refill ``rate`` (per second, or ``"600/min"``) and ``capacity``;
        None restores the policy's, ``UNSET`` leaves it as it is."""
        return self.admin.set_bucket(
            key_ref(ref, by),
            rate=rate,
            capacity=capacity,
            fuse=self.fuse.name,
        )

    def recent_events(self, count: int = 50) -> list[LoggedEvent]:
        """The newest events of the store's log (every fuse on it), oldest first."""
        return self.events.recent(count)


def _matches(view: KeyView, state: str, search: str) -> bool:
    if state != "all" and view.state != state:
        return False
    return not search or view.key_id.startswith(search) or search in (view.label or "").lower()


def window_of(state: VelocityState | None, now: float) -> list[Slot]:
    """The window's 13 slots at ``now``, oldest first, read without moving the ring: a slot
    the ring has not reached yet, or has dropped, is 0."""
    newest = math.floor(now / SLOT_SECONDS)
    slots = []
    for index in range(newest - SLOTS + 1, newest + 1):
        held = state is not None and state.head - SLOTS < index <= state.head
        amount = state.amounts[index % SLOTS] if state is not None and held else 0.0
        largest = state.largest[index % SLOTS] if state is not None and held else 0.0
        slots.append(Slot(start=index * SLOT_SECONDS, amount=amount, largest=largest))
    return slots
