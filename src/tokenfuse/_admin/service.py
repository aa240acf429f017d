"""``Admin``: what an operator can ask of a deployment's fuses, in one place.

The CLI calls it, and so can an admin web app: list the keys (every page of every fuse, with
filters and a sort), look one key up, reset it, change its limits, read the events. Keys are
named with a ``KeyRef`` (a key id, a name, or a credential said to be one); a reference that
could mean more than one key is an ``AmbiguousKey`` error that says what to pass.

Every call goes to the store as it is now (nothing is cached), and none writes anything a guarded
call would pay for: listing walks the store (``ListKeys``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from .._core.status import Status
from .._core.velocity import VelocityPolicy
from .._errors import ConfigurationError, TokenFuseError
from .._events import FuseEvent
from .._fuse import Fuse, checked_overrides
from .._identity import KEY_ID_LENGTH, Identity
from .._stores.base import SyncStore, sync_face
from .._stores.event_log import EventLog
from .._stores.ops import UNSET, Configure, Forgive, ListKeys, ReadStatus, Reset, Unset
from .feed import EventFeed, feed_for
from .refs import AmbiguousKey, KeyNotFound, KeyRef, looks_like_key_id
from .views import SORTS, KeyState, KeyView

__all__ = ["Admin", "NotAvailable"]

#: Listing stops after this many keys per fuse: a table of more helps no one, and memory stays
#: bounded however large the store.
MAX_LISTED = 100_000


class NotAvailable(TokenFuseError):
    """The operation needs something this version or this deployment does not have."""


@dataclass(frozen=True, slots=True)
class _Target:
    """One key of one fuse: by its identity (a name, a credential), or, found by its key id,
    by its store key (the store keeps no identity, only its keyed hash)."""

    fuse: Fuse
    identity: Identity | None
    key: str = ""  # the store key, when there is no identity
    label: str | None = None


class Admin:
    """The operator's side of some fuses (by default the process's: outbound and inbound).

    >>> admin = Admin()
    >>> [view.state for view in admin.keys()]
    []

    Args:
        fuses: the fuses to operate on; their names must differ. Default: the two fuses the
            zero-argument guards use (``tokenfuse.config.default_fuses()``), so an operator
            shell started with the deployment's ``TOKENFUSE_*`` environment sees its keys.
        feed: where events come from; default: the best feed of the first fuse's store.
        page_size: keys read per store round trip when listing.
    """

    def __init__(
        self,
        fuses: Fuse | Sequence[Fuse] | None = None,
        *,
        feed: EventFeed | None = None,
        page_size: int = 500,
    ) -> None:
        if fuses is None:
            from .._settings import default_fuses

            fuses = default_fuses()
        self.fuses = [fuses] if isinstance(fuses, Fuse) else list(fuses)
        names = [fuse.name for fuse in self.fuses]
        if not names or len(set(names)) != len(names):
            raise ConfigurationError(f"Admin needs fuses with distinct names, not {names}")
        self.feed = feed if feed is not None else feed_for(self.fuses[0].store)
        self.page_size = page_size

    # -- many keys ----------------------------------------------------------------------------

    def page(
        self, fuse: str, *, cursor: str = "", count: int | None = None, key_id: str = ""
    ) -> tuple[list[KeyView], str]:
        """One page of one fuse's keys (those whose key id starts with ``key_id``) and the
        cursor of the next (``""``: the last)."""
        chosen = self._fuse(fuse)
        op = ListKeys(
            f"{chosen.name}:{key_id}",
            chosen.velocity or _READS,
            chosen.bucket,
            cursor,
            count or self.page_size,
        )
        page = _store(chosen).run(op)
        labels = self.labels()
        log = getattr(chosen.store, "events", None)
        if isinstance(log, EventLog) and page.statuses:  # labels the store keeps, with its TTL
            key_ids = [status.key.partition(":")[2][:KEY_ID_LENGTH] for status in page.statuses]
            labels.update(log.labels(chosen.name, key_ids))
        views = [_view(chosen, status, labels) for status in page.statuses]
        return views, page.cursor

    def keys(
        self,
        *,
        fuse: str | None = None,
        state: KeyState | None = None,
        sort: str = "rate",
        limit: int | None = None,
    ) -> list[KeyView]:
        """Every key (of one fuse, or all), optionally only those in ``state``, sorted by
        ``sort`` (``rate``, ``multiple``, ``baseline``, ``bucket``, ``state``), at most
        ``limit`` of them."""
        if sort not in SORTS:
            raise ConfigurationError(f"sort must be one of {', '.join(SORTS)}, not {sort!r}")
        views = [view for chosen in self._fuses(fuse) for view in self._every(chosen.name)]
        if state is not None:
            views = [view for view in views if view.state == state]
        views.sort(key=lambda view: view.sort_key(sort))
        return views[:limit] if limit is not None else views

    def blocked(self, *, fuse: str | None = None) -> list[KeyView]:
        """The keys open now (refusing every call), the latest to close first."""
        views = self.keys(fuse=fuse, state="open")
        return sorted(views, key=lambda view: -(view.status.open_until or 0.0))

    # -- one key ------------------------------------------------------------------------------

    def find(self, ref: KeyRef | str, *, fuse: str | None = None) -> list[KeyView]:
        """The key ``ref`` names, in each fuse that has it (``KeyNotFound`` if none does)."""
        targets = self._targets(_ref(ref), self._fuses(fuse), create=False)
        return [self._status(target) for target in targets]

    def reset(self, ref: KeyRef | str, *, fuse: str | None = None) -> list[KeyView]:
        """Close the key at once in each fuse that has it (``Fuse.reset``); its views after."""
        targets = self._targets(_ref(ref), self._fuses(fuse), create=False)
        for target in targets:
            if target.identity is not None:
                target.fuse.reset(target.identity)  # which reports it
            else:
                _store(target.fuse).run(op := Reset(target.key))
                self._report(target, op)
        return [self._status(target) for target in targets]

    def forgive(self, ref: KeyRef | str, *, fuse: str | None = None) -> list[KeyView]:
        """Forgive the key's last trip in each fuse that has it (``Fuse.forgive``): closed at
        once, and its rate taught as normal at that hour; its views after."""
        targets = self._targets(_ref(ref), self._fuses(fuse), create=False)
        for target in targets:
            if target.identity is not None:
                target.fuse.forgive(target.identity)  # which reports it
            else:
                _store(target.fuse).run(op := Forgive(target.key))
                self._report(target, op)
        return [self._status(target) for target in targets]

    def set_limit(
        self, ref: KeyRef | str, limit: float | str | None, *, fuse: str | None = None
    ) -> KeyView:
        """Set (None: clear) the key's manual ceiling per minute, live (``Fuse.set_limit``).
        A name or a credential that has no state yet gets one, in ``fuse`` or else the first
        fuse (the outbound one, by default): limits may come before the traffic."""
        (target,) = self._one(self._targets(_ref(ref), self._fuses(fuse), create=True), "set-limit")
        self._configure(target, checked_overrides(limit=limit))
        return self._status(target)

    def set_bucket(
        self,
        ref: KeyRef | str,
        *,
        rate: float | str | None | Unset = UNSET,
        capacity: float | None | Unset = UNSET,
        fuse: str | None = None,
    ) -> KeyView:
        """Change the key's bucket live (``Fuse.set_bucket``), in a fuse that has a bucket."""
        bucketed = [chosen for chosen in self._fuses(fuse) if chosen.bucket is not None]
        if not bucketed:
            raise ConfigurationError("none of these fuses has a bucket (inbound fuses do)")
        (target,) = self._one(self._targets(_ref(ref), bucketed, create=True), "set-bucket")
        self._configure(target, checked_overrides(rate=rate, capacity=capacity))
        return self._status(target)

    # -- events -------------------------------------------------------------------------------

    def events(self, limit: int = 100) -> list[FuseEvent]:
        """The latest events, oldest first."""
        return self.feed.recent(limit)

    def follow(self, stop: threading.Event, poll: float = 1.0) -> Iterator[FuseEvent]:
        """Each new event as it comes, until ``stop`` is set."""
        return self.feed.follow(stop, poll)

    def labels(self) -> dict[str, str]:
        """Labels by key id, as the events seen so far tell them (the store keeps only hashes)."""
        return {
            event.key_id: event.key
            for event in self.feed.recent(1_000)
            if event.key_id is not None and event.key is not None
        }

    # -- machinery ----------------------------------------------------------------------------

    def _fuse(self, name: str) -> Fuse:
        for chosen in self.fuses:
            if chosen.name == name:
                return chosen
        known = ", ".join(chosen.name for chosen in self.fuses)
        raise ConfigurationError(f"no fuse named {name!r} here (there are: {known})")

    def _fuses(self, name: str | None) -> list[Fuse]:
        return self.fuses if name is None else [self._fuse(name)]

    def _every(self, fuse: str, key_id: str = "") -> list[KeyView]:
        found: dict[str, KeyView] = {}  # Redis may list a key on two pages
        cursor = ""
        while len(found) < MAX_LISTED:
            views, cursor = self.page(fuse, cursor=cursor, key_id=key_id)
            found.update((view.status.key, view) for view in views)
            if not cursor:
                break
        return list(found.values())

    def _status(self, target: _Target) -> KeyView:
        fuse = target.fuse
        if target.identity is not None:
            status = fuse.status(target.identity)  # key: the label; key_id: the fuse's
            return KeyView.of(fuse.name, status, fuse.velocity, target.identity.label)
        op = ReadStatus(target.key, fuse.velocity or _READS, fuse.bucket)
        return KeyView.of(fuse.name, _store(fuse).run(op), fuse.velocity, target.label)

    def _configure(self, target: _Target, change: Configure) -> None:
        """Set ``change``'s overrides on the target: by its fuse (which reports it), or by its
        store key."""
        fuse = target.fuse
        if target.identity is not None:
            if not isinstance(change.limit, Unset):
                fuse.set_limit(target.identity, change.limit)
            if not (isinstance(change.rate, Unset) and isinstance(change.capacity, Unset)):
                fuse.set_bucket(target.identity, rate=change.rate, capacity=change.capacity)
        else:
            _store(fuse).run(op := replace(change, key=target.key))
            self._report(target, op)

    def _report(self, target: _Target, op: Reset | Forgive | Configure) -> None:
        """An operator's change to a key found by its id, as an event every listener (and the
        event feed) sees."""
        key_id = target.key.partition(":")[2][:KEY_ID_LENGTH]
        target.fuse.changed_by_key(target.label or key_id, key_id, op)

    def _targets(self, ref: KeyRef, fuses: list[Fuse], *, create: bool) -> list[_Target]:
        """The keys ``ref`` names in ``fuses``; raises unless exactly one key (in one or more
        fuses) fits, or, with ``create``, none yet and ``ref`` can name a new one."""
        by_id = self._by_key_id(ref, fuses) if ref.kind in ("id", "any") else []
        by_name = self._existing(ref, fuses) if ref.kind != "id" else []
        if by_id and by_name:
            raise AmbiguousKey(
                f"{ref.text!r} is both a key id and a name: pass --id {ref.text} or "
                f"--name {ref.text}"
            )
        digests = {target.key.partition(":")[2] for target in by_id}
        if len(digests) > 1:
            shown = ", ".join(sorted(digest[:16] for digest in digests))
            raise AmbiguousKey(
                f"key id {ref.text!r} starts {len(digests)} keys ({shown}): give more of it"
            )
        found = by_id or by_name
        if found:
            return found
        if create and ref.kind != "id" and not (ref.kind == "any" and looks_like_key_id(ref.text)):
            return [_Target(fuses[0], ref.identity())]  # new: in the first fuse chosen
        raise KeyNotFound(_not_found(ref, fuses))

    def _by_key_id(self, ref: KeyRef, fuses: Iterable[Fuse]) -> list[_Target]:
        if not looks_like_key_id(ref.text):
            return []
        return [  # a listed view has the label the events and the store's log know
            _Target(chosen, None, view.status.key, view.label)
            for chosen in fuses
            for view in self._every(chosen.name, ref.text)
        ]

    def _existing(self, ref: KeyRef, fuses: Iterable[Fuse]) -> list[_Target]:
        identity = ref.identity()
        found = []
        for chosen in fuses:
            status = chosen.status(identity)
            if status.first_seen is not None or status.bucket_level is not None:
                found.append(_Target(chosen, identity))
        return found

    def _one(self, targets: list[_Target], what: str) -> list[_Target]:
        if len(targets) > 1:
            names = " or ".join(f"--fuse {target.fuse.name}" for target in targets)
            raise AmbiguousKey(f"{what}: the key is in more than one fuse: pass {names}")
        return targets


_READS = VelocityPolicy()  # to read the statuses of a fuse without a velocity policy


def _store(fuse: Fuse) -> SyncStore:
    store = sync_face(fuse.store)
    if store is None:
        raise ConfigurationError(f"{fuse.store!r} is async-only: Admin needs a sync store")
    return store


def _ref(ref: KeyRef | str) -> KeyRef:
    return ref if isinstance(ref, KeyRef) else KeyRef.parse(ref)


def _view(fuse: Fuse, status: Status, labels: dict[str, str]) -> KeyView:
    view = KeyView.of(fuse.name, status, fuse.velocity)
    label = labels.get(view.key_id)
    return view if label is None else replace(view, label=label)


def _not_found(ref: KeyRef, fuses: Sequence[Fuse]) -> str:
    where = ", ".join(fuse.name for fuse in fuses)
    if ref.kind == "id":
        return f"no key of the fuses {where} has a key id starting {ref.text!r}"
    if ref.kind == "secret":
        return (
            f"the fuses {where} have no key for the credential {ref}: is TOKENFUSE_SECRET the "
            "deployment's?"
        )
    looked = "a key id or a name" if ref.kind == "any" else "a name"
    hint = " (for a credential, pass --secret)" if ref.kind == "any" else ""
    return f"no key of the fuses {where} matches {ref.text!r} as {looked}{hint}"
