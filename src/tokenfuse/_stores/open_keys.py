"""The open keys of a ``RedisStore``, known locally: a gate without a round trip.

A gate only asks "is this key open?", and keys open rarely (a trip) and close rarely (a reset,
or their cooldown running out). So every process keeps a view of the open keys and answers
its gates from it, as soon as it can trust it:

* **Learning.** The scripts announce every change of a latch (``lua/_lib.lua``,
  "Announcements"): a trip PUBLISHes ``o <open_until> <refusal> <key>`` on
  ``<prefix>:open-keys`` and keeps a marker ``<prefix>:open:{<key>}`` that expires with the
  latch; a reset or a forgive PUBLISHes ``c <key>`` and deletes the marker. A background
  thread subscribes to the channel and applies each message as it comes. Plain PUBLISH
  reaches every node of a Cluster, so one subscription on any node hears them all.
* **Trust.** The view answers only once it is *synced*: subscribed (the server confirmed it),
  then every marker read (one SCAN over every primary), so no trip made before the
  subscription is missed. A message that arrives meanwhile waits in the socket and is applied
  after the markers, in order. The thread pings the server every ``HEARTBEAT`` seconds; a view
  that heard nothing for ``STALE_AFTER`` seconds (a dead, paused or blackholed server, a stuck
  thread), whose connection broke, or that was re-subscribed (redis-py reconnects by itself)
  is not trusted until it has synced again.
* **Fallback.** An untrusted view answers nothing: the gate is the round trip it always was
  (``counts.round_trips``), so a dead store still fails open or closed as configured. A lost
  subscription is logged (at most once a minute) and counted (``counts.lost``).
* **This process's own trips.** A decision of this process that trips a key marks it here at
  once, so the next gate goes to the store (which refuses) without waiting for the message.
  The mark stays until the store's gate allows the key (or this process resets it): the
  refusals of a key this process tripped cost a round trip each, exact to the double.

What it costs: one connection and one thread per store, a PING every ``HEARTBEAT`` seconds,
and on each trip or reset one PUBLISH and one marker write. Ordinary decisions write nothing
more. What it does not promise: a trip made during the last ``STALE_AFTER`` seconds before a
silent connection loss is seen, at the latest, when the view has synced again.

>>> view = OpenKeys(client_factory, prefix="tokenfuse")   # doctest: +SKIP
>>> view.answer("tokenfuse:{default:3f9c}")               # None: ask the store
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .._core.admission import AdmitVerdict
from .._core.lease import LeaseVerdict
from .._core.velocity import REASON_CODES, VelocityVerdict
from .ops import Admit, Forgive, Gate, Lease, Op, Record, RecordBatch, Reset, ReturnLease

__all__ = ["HEARTBEAT", "STALE_AFTER", "OpenKeyCounts", "OpenKeys"]

logger = logging.getLogger("tokenfuse")

#: Seconds between two pings on the subscription.
HEARTBEAT = 0.5
#: Seconds of silence after which the view is not trusted any more.
STALE_AFTER = 1.5
#: The longest wait between two attempts to subscribe again.
RETRY_MAX = 5.0
#: How long the server may take to confirm a subscription.
CONFIRM_WITHIN = 2.0
_LOG_EVERY = 60.0

# A refusal as the scripts write it: '0 0 <reason> <rate> <limit> <baseline> <multiple>
# <retry_after> <window>'; the view keeps all but allowed, tripped and retry_after.
Refusal = tuple[str | None, float, float | None, float | None, float | None, float | None]
_REFUSAL_FIELDS = 9


@dataclass(slots=True)
class OpenKeyCounts:
    """What the view did since it was made.

    >>> OpenKeyCounts().round_trips
    0
    """

    local: int = 0  # gates answered from the view, no round trip
    round_trips: int = 0  # gates left to the store: view not trusted, or no refusal known
    syncs: int = 0  # times the view became trusted (subscribed, then markers read)
    lost: int = 0  # subscriptions lost (connection broken, silence, re-subscription)


def _maybe(text: str) -> float | None:
    value = float(text)
    return None if value != value else value


def _refusal(fields: list[str]) -> Refusal:
    """The 9 fields of a gate's refusal, minus allowed, tripped and retry_after."""
    return (
        REASON_CODES.get(int(fields[2])),
        float(fields[3]),
        _maybe(fields[4]),
        _maybe(fields[5]),
        _maybe(fields[6]),
        _maybe(fields[8]),
    )


def _text(data: bytes | str) -> str:
    return data.decode() if isinstance(data, bytes) else data


def _glob_escape(text: str) -> str:
    return "".join(f"\\{char}" if char in "*?[]\\" else char for char in text)


class OpenKeys:
    """This process's view of a ``RedisStore``'s open keys, kept by a subscriber thread.

    ``answer(key)`` is the gate: a verdict when the view is trusted, None to ask the store.
    Keys are the store's Redis keys (``<prefix>:{<key>}``).

    Args:
        connect: makes the sync client to subscribe and scan with, and returns it with what
            releases it (closes its sockets) once its subscription ends.
        prefix: the store's prefix: channel ``<prefix>:open-keys``, markers ``<prefix>:open:*``.
        clock: the store's clock, if it has one (then latches are compared in its frame, as
            the scripts do); None for the server's clock (then in this host's monotonic time).
    """

    def __init__(
        self,
        connect: Callable[[], tuple[Any, Callable[[], None]]],
        *,
        prefix: str,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.channel = f"{prefix}:open-keys"
        self._markers = f"{_glob_escape(prefix)}:open:*"
        self._marker_start = len(prefix) + len(":open:")
        self._prefix = prefix
        self._connect = connect
        self._clock = clock
        self._now: Callable[[], float] = clock if clock is not None else time.monotonic
        self.counts = OpenKeyCounts()
        # key -> (until, refusal or None: open, ask the store for the refusal)
        self._open: dict[str, tuple[float, Refusal | None]] = {}
        self._trusted = False
        self._heard = float("-inf")  # monotonic time of the last message or pong
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._lock = threading.Lock()
        self._next_warning = 0.0
        self._changed = threading.Condition()  # notified at each change: tests wait on it
        #: Called with (kind, key) for each announcement applied: ``o`` opened, ``c`` closed
        #: (reset or forgiven), ``u`` live overrides changed. Leases renew on them.
        self.listeners: list[Callable[[str, str], None]] = []
        _after_fork.add(self)

    def __repr__(self) -> str:
        return f"OpenKeys({self.channel!r}, trusted={self.trusted})"

    @property
    def trusted(self) -> bool:
        """Whether gates are answered here (subscribed, synced, heard from lately)."""
        return self._trusted and time.monotonic() - self._heard <= STALE_AFTER

    # -- the gate -------------------------------------------------------------------------------

    def answer(self, key: str) -> VelocityVerdict | None:
        """The gate's verdict for ``key`` from the view, or None: ask the store."""
        if not self.trusted:
            self.start()
            self.counts.round_trips += 1
            return None
        entry = self._open.get(key)
        if entry is not None:
            until, refusal = entry
            now = self._now()
            if until > now:
                if refusal is None:
                    self.counts.round_trips += 1
                    return None
                reason, rate, limit, baseline, multiple, window = refusal
                return VelocityVerdict(False, False, reason, rate, limit, baseline, multiple,
                                       until - now, window)  # fmt: skip
            self._open.pop(key, None)
        self.counts.local += 1
        return VelocityVerdict(allowed=True)

    def learn(self, op: Op[Any], key: str, result: object) -> None:
        """What a decision of this process, made by the store, tells the view.

        A trip marks the key at once: its gates go to the store (which refuses), so the very
        next call is refused. A reset or a forgive forgets it; so does a gate the store
        allowed (the cooldown ran out, or another process reset or forgave the key).
        """
        kind = type(op)
        if kind is Gate:
            if isinstance(result, VelocityVerdict) and result.allowed:
                entry = self._open.get(key)
                if entry is not None and entry[1] is None:
                    self._open.pop(key, None)
        elif kind is Record or kind is RecordBatch or kind is Admit:
            verdict = result.velocity if isinstance(result, AdmitVerdict) else result
            if isinstance(verdict, VelocityVerdict) and verdict.tripped:
                self._open[key] = (float("inf"), None)
        elif kind is Lease or kind is ReturnLease:
            # the amounts a lease admitted are recorded when it is renewed or given back
            tripped = result.tripped if isinstance(result, LeaseVerdict) else result
            admitted = result.admit.velocity if isinstance(result, LeaseVerdict) else None
            for verdict in (tripped, admitted):
                if isinstance(verdict, VelocityVerdict) and verdict.tripped:
                    self._open[key] = (float("inf"), None)
        elif kind is Reset or kind is Forgive:
            self._open.pop(key, None)

    # -- the subscriber thread -------------------------------------------------------------------

    def start(self) -> None:
        """Start the subscriber thread, if it is not running (idempotent, cheap)."""
        if self._thread is not None or self._stop.is_set():
            return
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=_subscriber,
                    args=(weakref.ref(self),),
                    name=f"tokenfuse-open-keys:{self._prefix}",
                    daemon=True,
                )
                self._thread.start()

    def wait_synced(self, timeout: float) -> bool:
        """Start the thread and wait up to ``timeout`` s for the view to be trusted."""
        self.start()
        return self._synced.wait(timeout) and self.trusted

    def wait_until(self, done: Callable[[OpenKeys], bool], timeout: float) -> bool:
        """Wait up to ``timeout`` s for ``done(self)``, checked at each change of the view."""
        with self._changed:
            return self._changed.wait_for(lambda: done(self), timeout)

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def close(self) -> None:
        """Stop the thread and stop answering. The thread leaves within a heartbeat, closing
        its subscription and its client's sockets; this waits for it (bounded)."""
        self._stop.set()
        self._trusted = False
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(HEARTBEAT * 2 + CONFIRM_WITHIN)

    def _subscribe(self, release: list[Callable[[], None]]) -> tuple[Any, Any]:
        """A client and its subscription to the channel (not yet confirmed); what releases
        the client goes in ``release`` as soon as it exists, so that a failure to subscribe
        still closes it."""
        client, close = self._connect()
        release.append(close)
        pubsub = client.pubsub()
        pubsub.subscribe(self.channel)
        self._heard = time.monotonic()  # the confirmation is due within CONFIRM_WITHIN
        return client, pubsub

    def _step(self, client: Any, pubsub: Any, next_ping: float) -> float:
        """Wait a little for a message and apply it; ping when due; raise on silence.
        Returns when the next ping is due."""
        message = pubsub.get_message(timeout=HEARTBEAT / 2)
        now = time.monotonic()
        if message is not None:
            self._heard = now
            self._handle(client, message)
        if now >= next_ping:
            pubsub.ping()
            next_ping = now + HEARTBEAT
        silence = now - self._heard
        if silence > (STALE_AFTER if self._trusted else CONFIRM_WITHIN):
            raise TimeoutError(f"no word from the server for {silence:.1f} s")
        return next_ping

    def _unsubscribed(self) -> None:
        self._trusted = False
        self._synced.clear()

    def _handle(self, client: Any, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "subscribe":
            # The first confirmation, or redis-py's own reconnection, which subscribes again
            # silently: whatever was published in between is lost, so read the markers.
            if self._trusted:
                self._lose(ConnectionError("re-subscribed after a reconnection"))
            self._sync(client)
        elif kind == "message":
            self.apply(_text(message["data"]))

    def apply(self, text: str) -> None:
        """Apply one announcement (the scripts' message format, ``lua/_lib.lua``)."""
        kind, _, rest = text.partition(" ")
        key = rest
        if kind == "o":
            # '<open_until> <refusal> <key>': the key last, as it may hold spaces.
            fields = rest.split(" ", _REFUSAL_FIELDS + 1)
            if len(fields) == _REFUSAL_FIELDS + 2:
                key = fields[-1]
                self._opened(key, float(fields[0]), fields[1:-1])
        elif kind == "c" and self._announced(rest):
            self._open.pop(rest, None)
        for listener in self.listeners:
            try:
                listener(kind, key)
            except Exception:  # a listener's bug must not stop the view
                logger.exception("tokenfuse: an open-key listener failed")
        self._notify()

    def _announced(self, key: str) -> bool:
        """Whether the view's entry for ``key`` came from announcements, not from this
        process's own trip (those stay until the store itself says the key is closed: an
        announcement may be older than the trip, and the store's refusal is exact)."""
        entry = self._open.get(key)
        return entry is None or entry[1] is not None

    def _opened(self, key: str, open_until: float, refusal: list[str]) -> None:
        # In the store's clock frame when it has a clock (exactly as the scripts compare);
        # else the refusal's retry_after, counted from now on this host's monotonic clock.
        until = open_until if self._clock is not None else self._now() + float(refusal[7])
        if self._announced(key):
            self._open[key] = (until, _refusal(refusal))

    def _sync(self, client: Any) -> None:
        """Read every marker (SCAN on every primary), then trust the view."""
        self._trusted = False
        found: dict[str, tuple[float, Refusal | None]] = {}
        server_now = None if self._clock is not None else _server_time(client)
        names = list(client.scan_iter(match=self._markers, count=1000))
        values = _values(client, names)
        now = self._now()
        for name, value in zip(names, values, strict=True):
            if value is None:
                continue  # expired between the SCAN and the GET
            fields = _text(value).split(" ")
            open_until = float(fields[0])
            # The server's clock: the time left, from now on this host's monotonic clock.
            until = open_until if server_now is None else now + (open_until - server_now)
            if until > now:
                tagged = _text(name)[self._marker_start :]
                found[f"{self._prefix}:{tagged}"] = (
                    until,
                    _refusal(fields[1 : _REFUSAL_FIELDS + 1]),
                )
        # In place: a trip this process marks meanwhile (from another thread) must not be lost.
        # Own marks not yet announced stay; everything else is what the markers say.
        for key, (_, refusal) in list(self._open.items()):
            if refusal is not None and key not in found:
                self._open.pop(key, None)
        self._open.update(found)
        self._heard = time.monotonic()
        self._trusted = True
        self.counts.syncs += 1
        self._synced.set()
        self._notify()
        logger.debug("tokenfuse: open-key view of %r synced (%d open)", self._prefix, len(found))

    def _lose(self, exc: BaseException) -> None:
        if self._stop.is_set():
            return
        self._trusted = False
        self.counts.lost += 1
        now = time.monotonic()
        if now >= self._next_warning:
            self._next_warning = now + _LOG_EVERY
            logger.warning(
                "tokenfuse: lost the open-key subscription of %r (%s); gates make a round "
                "trip until it is back (%d lost so far)",
                self._prefix,
                exc,
                self.counts.lost,
            )
        self._notify()

    def _forked(self) -> None:
        """In a child process: the thread did not come along; start afresh on next use."""
        self._thread = None
        self._trusted = False
        self._synced.clear()
        self._lock = threading.Lock()


def _subscriber(ref: weakref.ref[OpenKeys]) -> None:
    """The thread: follow the channel, subscribing again after each loss, until the view is
    closed or its store is gone. It holds the view only for one step at a time, so a store
    dropped without ``close()`` takes its thread and connection with it."""
    wait = 0.1
    while (view := ref()) is not None and not view._stop.is_set():
        stop = view._stop
        del view
        lost = _follow(ref)
        if lost is None:
            return  # closed, or the store is gone
        stop.wait(wait)
        wait = min(wait * 2, RETRY_MAX)


def _follow(ref: weakref.ref[OpenKeys]) -> Exception | None:
    """One subscription, followed until it is lost (the error) or the view is gone (None)."""
    view = ref()
    if view is None:
        return None
    pubsub = None
    release: list[Callable[[], None]] = []
    try:
        client, pubsub = view._subscribe(release)
        next_ping = time.monotonic() + HEARTBEAT
        while not view._stop.is_set():
            next_ping = view._step(client, pubsub, next_ping)
            del view
            if (view := ref()) is None:
                return None
        return None
    except Exception as exc:
        if view is not None:
            view._lose(exc)
        return exc
    finally:
        if view is not None:
            view._unsubscribed()
        _close(pubsub, release)


def _close(pubsub: Any, release: list[Callable[[], None]]) -> None:
    """Close a subscription and its client's sockets: each subscription has a client of its
    own, which no one else closes (a socket left to the collector is a leak, and a warning in
    whatever runs when it is collected)."""
    if pubsub is not None:
        with contextlib.suppress(Exception):  # a broken connection may fail to close
            pubsub.close()
    for close in release:
        with contextlib.suppress(Exception):
            close()


def _server_time(client: Any) -> float:
    seconds, micros = client.time()
    return float(seconds) + float(micros) / 1_000_000


def _values(client: Any, names: Iterable[bytes | str]) -> list[Any]:
    """GET of each name, in one pipeline (grouped per node on a Cluster)."""
    names = list(names)
    if not names:
        return []
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.get(name)
    return list(pipe.execute())


# Every view, to reset in a forked child (weak: a view lives as long as its store).
_after_fork: weakref.WeakSet[OpenKeys] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for view in list(_after_fork):
        view._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
