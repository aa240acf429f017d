"""What the admin app asks of one fuse: its keys, one key in detail, a key by id or name, and
live changes. ``Panel(fuse)``; every method has an asyncio twin (``keys`` / ``akeys``), both
running one plan (``_plans``), so the logic is written once.

* **Listing costs the hot path nothing.** It pages through the store (``ListKeys``: SCAN on
  every primary of a Redis Cluster, the table of a ``MemoryStore``), reading at most
  ``max_scan`` keys, then filters, sorts and pages them here.
* **Keys are shown by id and label.** The store holds hashes only. A key's id (the first 12 hex
  characters of its hash, ``Identity.key_id``) always shows; its label (``sk-…9c21``,
  ``agent-42``) shows once the store's event log has learned it from an event about the key (a
  trip, a near-limit episode, a reset, a live change). No raw credential is stored or shown.
* **Addressing is never silently wrong.** ``resolve`` takes a key id (or a unique start of one,
  4 to 32 hex characters), a name, or an ``Identity`` (``Identity.secret(api_key)`` for a
  credential, said to be one). A string that is both a key id and a name with state, or an id
  start shared by several keys, raises ``AmbiguousKey`` saying what to pass.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .._core.status import Status, status_of
from .._core.velocity import REASON_CODES, SLOT_SECONDS, SLOTS, VelocityPolicy, VelocityState
from .._errors import ConfigurationError, TokenFuseError
from .._fuse import Fuse
from .._identity import KEY_ID_LENGTH, Identity
from .._plans import Call, Plan, acall, adrive, call, drive
from .._stores.event_log import EventLog, LoggedEvent, MemoryEventLog
from .._stores.ops import UNSET, KeyPage, ListKeys, ReadState, StoredState, Unset
from .history import MinuteHistory

__all__ = [
    "SORTS",
    "AmbiguousKey",
    "KeyDetail",
    "KeyNotFound",
    "KeyView",
    "Listing",
    "NotSupported",
    "Panel",
    "Slot",
    "event_log",
]

#: The orders a listing can have (open keys always come first).
SORTS = ("rate", "multiple", "fill", "baseline", "key")
State = Literal["all", "open", "closed"]
By = Literal["auto", "id", "name"]

_KEY_ID = re.compile(r"[0-9a-f]{4,32}")
_PAGE = 1_000  # keys per store page while scanning
_HOUR = 3_600.0


class KeyNotFound(TokenFuseError, LookupError):
    """No key matches: the message says what was looked for and what to pass instead."""


class AmbiguousKey(TokenFuseError, LookupError):
    """More than one key matches: the message says what to pass to choose one."""


class NotSupported(TokenFuseError):
    """The operation needs something this fuse does not have (``Fuse.forgive``)."""


def _digest(store_key: str) -> str:
    """The identity's hash in a store key (``<fuse name>:<hash>``)."""
    return store_key.rpartition(":")[2]


@dataclass(frozen=True, slots=True)
class KeyView:
    """One key as the table shows it. Rates are per minute in the fuse's ``unit``."""

    key_id: str
    label: str | None
    """What events and refusals call the key; None until an event about it taught it."""
    fuse: str
    unit: str
    open: bool
    """Tripped: refusing every call until ``open_until``."""
    open_until: float | None
    rate: float
    baseline: float | None
    """The established baseline (the spike check is armed); None while learning."""
    learned_baseline: float
    samples: int
    multiple: float | None
    threshold: float | None
    """The rate that trips the automatic check: ``spike_multiple`` x the baseline once it is
    established and at least ``min_baseline``, else the cold-start ceiling (None: none)."""
    limit: float | None
    """The manual ceiling in force (a live ``set_limit`` wins over the policy's)."""
    bucket_level: float | None
    bucket_capacity: float | None
    bucket_rate: float | None
    bucket_fill: float | None
    """``bucket_level / bucket_capacity`` (0 empty, 1 full); None without a bucket."""

    def to_json(self) -> dict[str, Any]:
        return _finite(asdict(self))


@dataclass(frozen=True, slots=True)
class Slot:
    """One 5-second slot of the key's 60-second window."""

    start: float
    amount: float
    largest: float


@dataclass(frozen=True, slots=True)
class Listing:
    """A page of keys, open ones first. ``total`` keys matched the filters among the
    ``scanned`` ones; ``complete`` is False when ``max_scan`` stopped the scan early."""

    keys: list[KeyView]
    total: int
    scanned: int
    complete: bool
    at: float

    def to_json(self) -> dict[str, Any]:
        fields = {"total": self.total, "scanned": self.scanned, "complete": self.complete}
        return {"keys": [view.to_json() for view in self.keys], **fields, "at": self.at}


@dataclass(frozen=True, slots=True)
class KeyDetail:
    """One key in full: its view; its last trip; its 60-second window slot by slot; its rate
    minute by minute over the last hour as this process saw it (``MinuteHistory``, since
    ``history_since``); and its events of the last hour from the store's event log."""

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
            "key": self.key.to_json(),
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


class Panel:
    """The keys of one ``Fuse``, for the admin app: listing, detail, lookup, live changes.

    >>> panel = Panel(Fuse())                                      # doctest: +SKIP
    >>> [view.key_id for view in panel.keys(state="open").keys]    # doctest: +SKIP
    ['3f9a0c12ab45']

    Args:
        fuse: the fuse whose keys to show (its name selects them in a shared store).
        max_scan: the most keys one listing reads (it sorts what it read).
        history: where the per-minute rates are kept (the app keeps one per process).
    """

    #: The most events a detail looks through for the key's own.
    events_searched = 10_000

    def __init__(
        self, fuse: Fuse, *, max_scan: int = 10_000, history: MinuteHistory | None = None
    ) -> None:
        self.fuse = fuse
        self.max_scan = max_scan
        self.events = event_log(fuse)
        self.history = history or MinuteHistory(max_keys=max_scan)
        self.velocity = fuse.velocity or VelocityPolicy()

    # -- listing --------------------------------------------------------------------------------

    def keys(
        self,
        *,
        state: State = "all",
        sort: str = "rate",
        search: str = "",
        limit: int = 50,
        offset: int = 0,
    ) -> Listing:
        """The fuse's keys, open ones first, then by ``sort`` (largest first; ``key``: by id).
        ``state`` keeps the open or the closed ones; ``search`` the keys whose id starts with
        it or whose label holds it (in any case)."""
        result: Listing = drive(self._keys(state, sort, search, limit, offset), call)
        return result

    async def akeys(
        self,
        *,
        state: State = "all",
        sort: str = "rate",
        search: str = "",
        limit: int = 50,
        offset: int = 0,
    ) -> Listing:
        result: Listing = await adrive(self._keys(state, sort, search, limit, offset), acall)
        return result

    def _scan(self, start: str, most: int | None) -> Plan[Call, tuple[list[Status], bool]]:
        """The statuses of the keys under ``start``, all or the first ``most``: (statuses,
        whether that was all). Redis may list a key twice: each is kept once."""
        found: dict[str, Status] = {}
        cursor = ""
        while most is None or len(found) < most:
            op = ListKeys(start, self.velocity, self.fuse.bucket, cursor, _PAGE)
            page: KeyPage = yield Call(self.fuse.store, "run", (op,))
            found.update((status.key, status) for status in page.statuses)
            cursor = page.cursor
            if not cursor:
                break
        kept = list(found.values())[:most]
        return kept, not cursor and len(kept) == len(found)

    def _keys(
        self, state: str, sort: str, search: str, limit: int, offset: int
    ) -> Plan[Call, Listing]:
        if state not in ("all", "open", "closed"):
            raise ConfigurationError(f"state must be all, open or closed, not {state!r}")
        if sort not in SORTS:
            raise ConfigurationError(f"sort must be one of {', '.join(SORTS)}, not {sort!r}")
        statuses, complete = yield from self._scan(f"{self.fuse.name}:", self.max_scan)
        at = time.time()
        self.history.observe(((status.key, status.rate) for status in statuses), at)
        labels = yield from self._labels([_digest(s.key)[:KEY_ID_LENGTH] for s in statuses])
        views = [self._view(s, labels.get(_digest(s.key)[:KEY_ID_LENGTH])) for s in statuses]
        wanted = [view for view in views if _matches(view, state, search.strip().lower())]
        wanted.sort(key=lambda view: _order(view, sort))
        page = wanted[max(offset, 0) : max(offset, 0) + max(limit, 0)]
        return Listing(page, len(wanted), len(statuses), complete, at)

    def _labels(self, key_ids: Sequence[str]) -> Plan[Call, dict[str, str]]:
        labels: dict[str, str] = yield Call(self.events, "labels", (self.fuse.name, key_ids))
        return labels

    def _view(self, status: Status, label: str | None) -> KeyView:
        return view_of(status, label, self.fuse.name, self.velocity)

    # -- one key ------------------------------------------------------------------------------

    def detail(self, ref: str | Identity, *, by: By = "auto") -> KeyDetail:
        """One key in full (``KeyNotFound`` if the store holds nothing for it)."""
        result: KeyDetail = drive(self._detail(ref, by), call)
        return result

    async def adetail(self, ref: str | Identity, *, by: By = "auto") -> KeyDetail:
        result: KeyDetail = await adrive(self._detail(ref, by), acall)
        return result

    def _detail(self, ref: str | Identity, by: By) -> Plan[Call, KeyDetail]:
        identity = yield from self._resolve(ref, by)
        key = self._key(identity)
        state: StoredState = yield Call(self.fuse.store, "run", (ReadState(key),))
        if state.velocity is None and state.bucket is None:
            raise KeyNotFound(f"the store holds nothing for key {identity.label}")
        status = _status_of(state, self.velocity, self.fuse)
        self.history.observe([(key, status.rate)], time.time())
        labels = yield from self._labels([identity.key_id])
        label = labels.get(identity.key_id) or _chosen_label(identity)
        logged = yield Call(self.events, "since", (state.now - _HOUR, self.events_searched))
        mine = [e for e in logged if e.key_id == identity.key_id and e.fuse == self.fuse.name]
        velocity = state.velocity
        tripped = velocity is not None and velocity.last_trip > 0
        return KeyDetail(
            key=self._view(status, label),
            window=window_of(velocity, state.now),
            minutes=self.history.minutes(key, time.time()),
            history_since=self.history.since,
            trip_reason=REASON_CODES.get(velocity.trip_reason) if tripped and velocity else None,
            last_trip=velocity.last_trip if tripped and velocity else None,
            strikes=velocity.strikes if velocity else 0,
            events=mine,
        )

    # -- finding a key ------------------------------------------------------------------------

    def resolve(self, ref: str | Identity, *, by: By = "auto") -> Identity:
        """The identity ``ref`` names: a key id (or a unique start of one), a name, or an
        ``Identity`` as is. ``by`` says which a string is when it could be both."""
        result: Identity = drive(self._resolve(ref, by), call)
        return result

    async def aresolve(self, ref: str | Identity, *, by: By = "auto") -> Identity:
        result: Identity = await adrive(self._resolve(ref, by), acall)
        return result

    def _key(self, identity: Identity) -> str:
        return f"{self.fuse.name}:{identity.key}"

    def _exists(self, identity: Identity) -> Plan[Call, bool]:
        state = yield Call(self.fuse.store, "run", (ReadState(self._key(identity)),))
        return state.velocity is not None or state.bucket is not None

    def _resolve(self, ref: str | Identity, by: By) -> Plan[Call, Identity]:
        if isinstance(ref, Identity):
            return ref
        if by not in ("auto", "id", "name") or not isinstance(ref, str) or not ref:
            raise ConfigurationError("a key is a non-empty id or name; by is auto, id or name")
        if by == "name":
            return Identity.named(ref)
        if _KEY_ID.fullmatch(ref) is None:
            if by == "id":
                raise ConfigurationError(f"{ref!r} is no key id (4 to 32 hex characters)")
            return Identity.named(ref)
        statuses, _ = yield from self._scan(f"{self.fuse.name}:{ref}", None)
        digests = sorted({_digest(status.key) for status in statuses})
        named = Identity.named(ref)
        if by == "auto" and digests != [named.key] and (yield from self._exists(named)):
            if digests:
                raise AmbiguousKey(
                    f"{ref!r} is both a key id and a name with state of its own: "
                    "pass by='id' or by='name'"
                )
            return named
        if len(digests) > 1:
            shown = ", ".join(digest[:KEY_ID_LENGTH] for digest in digests[:5])
            raise AmbiguousKey(
                f"key id {ref!r} starts {len(digests)} keys ({shown}"
                f"{', …' if len(digests) > 5 else ''}): give more of it"
            )
        if not digests:
            hint = "" if by == "id" else "; to address a new name, pass by='name'"
            raise KeyNotFound(f"no key of fuse {self.fuse.name!r} has the id {ref!r}{hint}")
        key_id = digests[0][:KEY_ID_LENGTH]
        labels = yield from self._labels([key_id])
        return Identity(key=digests[0], label=labels.get(key_id, key_id))

    # -- live changes: every process sharing the store sees them, and its log records them ----

    def reset(self, ref: str | Identity, *, by: By = "auto") -> Identity:
        """Close the key at once, clear its window and escalation (``Fuse.reset``)."""
        result: Identity = drive(self._change(ref, by, "reset"), call)
        return result

    async def areset(self, ref: str | Identity, *, by: By = "auto") -> Identity:
        result: Identity = await adrive(self._change(ref, by, "reset"), acall)
        return result

    def forgive(self, ref: str | Identity, *, by: By = "auto") -> Identity:
        """``Fuse.forgive`` (detection v2); ``NotSupported`` on a fuse without it."""
        result: Identity = drive(self._change(ref, by, "forgive"), call)
        return result

    async def aforgive(self, ref: str | Identity, *, by: By = "auto") -> Identity:
        result: Identity = await adrive(self._change(ref, by, "forgive"), acall)
        return result

    def set_limit(
        self, ref: str | Identity, limit: float | str | None, *, by: By = "auto"
    ) -> Identity:
        """The key's manual ceiling per minute (``"50k/min"`` too); None clears it."""
        result: Identity = drive(self._change(ref, by, "set_limit", limit=limit), call)
        return result

    async def aset_limit(
        self, ref: str | Identity, limit: float | str | None, *, by: By = "auto"
    ) -> Identity:
        plan = self._change(ref, by, "set_limit", limit=limit)
        result: Identity = await adrive(plan, acall)
        return result

    def set_bucket(
        self,
        ref: str | Identity,
        *,
        rate: float | str | None | Unset = UNSET,
        capacity: float | None | Unset = UNSET,
        by: By = "auto",
    ) -> Identity:
        """The key's bucket refill ``rate`` (per second, or ``"600/min"``) and ``capacity``;
        None restores the policy's, ``UNSET`` leaves it as it is."""
        plan = self._change(ref, by, "set_bucket", rate=rate, capacity=capacity)
        result: Identity = drive(plan, call)
        return result

    async def aset_bucket(
        self,
        ref: str | Identity,
        *,
        rate: float | str | None | Unset = UNSET,
        capacity: float | None | Unset = UNSET,
        by: By = "auto",
    ) -> Identity:
        plan = self._change(ref, by, "set_bucket", rate=rate, capacity=capacity)
        result: Identity = await adrive(plan, acall)
        return result

    def _change(
        self, ref: str | Identity, by: By, method: str, **settings: Any
    ) -> Plan[Call, Identity]:
        if not hasattr(self.fuse, method):
            raise NotSupported(
                f"Fuse.{method} does not exist in this version of tokenfuse (forgiving a key "
                "comes with detection v2): reset the key instead"
            )
        identity = yield from self._resolve(ref, by)
        yield Call(self.fuse, method, (identity,), settings)
        return identity

    # -- events ---------------------------------------------------------------------------------

    def recent_events(self, count: int = 50) -> list[LoggedEvent]:
        """The newest events of the store's log (every fuse on it), oldest first."""
        return self.events.recent(count)

    async def arecent_events(self, count: int = 50) -> list[LoggedEvent]:
        return await self.events.arecent(count)


def _status_of(state: StoredState, velocity: VelocityPolicy, fuse: Fuse) -> Status:
    return status_of(state.key, state.velocity, state.bucket, state.now, velocity, fuse.bucket)


def _chosen_label(identity: Identity) -> str | None:
    """The identity's label unless it is only its id (a key found by id whose label the log
    has not learned)."""
    return None if identity.label == identity.key_id else identity.label


def _matches(view: KeyView, state: str, search: str) -> bool:
    if state != "all" and view.open != (state == "open"):
        return False
    if not search:
        return True
    return view.key_id.startswith(search) or search in (view.label or "").lower()


def _order(view: KeyView, sort: str) -> tuple[bool, float, str]:
    """Open keys first, then the largest ``sort`` value (unknown values last), then by id."""
    if sort == "key":
        return (not view.open, 0.0, view.key_id)
    value = {
        "rate": view.rate,
        "multiple": view.multiple,
        "fill": None if view.bucket_fill is None else 1.0 - view.bucket_fill,
        "baseline": view.baseline,
    }[sort]
    return (not view.open, -value if value is not None else math.inf, view.key_id)


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


def view_of(status: Status, label: str | None, fuse: str, velocity: VelocityPolicy) -> KeyView:
    """A key's view from its status (``status.key`` being its store key)."""
    baseline = status.baseline
    armed = baseline is not None and baseline >= velocity.min_baseline
    level, capacity = status.bucket_level, status.bucket_capacity
    if capacity is not None and level is None:
        level = capacity  # a bucket not used yet is full
    return KeyView(
        key_id=_digest(status.key)[:KEY_ID_LENGTH],
        label=label,
        fuse=fuse,
        unit=velocity.unit,
        open=status.open_until is not None,
        open_until=status.open_until,
        rate=status.rate,
        baseline=baseline,
        learned_baseline=status.learned_baseline,
        samples=status.samples,
        multiple=status.rate / baseline if baseline else None,
        threshold=velocity.spike_multiple * baseline
        if armed and baseline
        else velocity.cold_start_limit,
        limit=status.limit,
        bucket_level=level,
        bucket_capacity=capacity,
        bucket_rate=status.bucket_rate,
        bucket_fill=level / capacity if level is not None and capacity else None,
    )
