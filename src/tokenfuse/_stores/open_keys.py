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
* **This process's own resets and forgives** forget the key at once. The thread may run
  behind this process's decisions (a busy machine), so a trip announced before the reset can
  still be heard after it; until the reset's own announcement is heard (messages arrive in
  the order they were published), such a message is older than the reset and is ignored
  (``_Unheard``). Forgotten calls (``forget_loops``) are kept the same way.

* **Tripped calls** (the failure-loop breaker's): ``note_loop`` announces a trip as
  ``l <open_until> <fingerprint> <refusal> <loops key>`` with a marker
  ``<prefix>:open-loop:{<key>}:<fingerprint>`` that expires with the cooldown, and
  ``forget_loops`` announces ``f <fingerprint, or *> <loops key>`` (and deletes the markers).
  A ``CheckLoops`` whose caller needs only "is this call tripped?" (``op.local``: the
  transport, and the middleware in lease mode, when repeats are not refused) is answered here
  when the view is trusted: the refusal of a tripped call, else "allowed", which counts no
  send (the transport counts it after the call, with the call's note; the store's own answer
  to such a check, when the view is not trusted, counts none either). A trip computed from a
  note of this process (``NoteLoop``, or a background batch's ``NoteLoopBatch``) is marked
  at once, so the next check of the call is refused here without a round trip and without
  waiting for the announcement. Of the failures before a success, the view knows only those
  this process noted (``answer_loop`` returns their count). That count matters to a caller
  that notes a success only when it ends failures (the middleware): a call that failed only
  in other processes is answered with no failures, so its success there is not noted, and
  those failures stand until their window passes. The transport notes every call (its send),
  so its successes end every process's failures. At most ``MAX_LOOPS`` tripped calls are
  kept; beyond that, loop checks make a round trip until expired ones make room.

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
from dataclasses import dataclass, replace
from typing import Any

from .._core.admission import AdmitVerdict
from .._core.lease import LeaseVerdict
from .._core.loops import FINGERPRINT_LENGTH, LoopVerdict
from .._core.velocity import REASON_CODES, VelocityVerdict
from .ops import (
    Admit,
    CheckLoops,
    ForgetLoops,
    Forgive,
    Gate,
    Lease,
    NoteLoop,
    NoteLoopBatch,
    Op,
    Record,
    RecordBatch,
    Reset,
    ReturnLease,
)
from .redis_codec import loop_verdict_of

__all__ = ["HEARTBEAT", "MAX_LOOPS", "STALE_AFTER", "OpenKeyCounts", "OpenKeys"]

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
#: Tripped calls (and calls this process saw fail) the view keeps at most.
MAX_LOOPS = 10_000
_LOOP_FIELDS = 10  # a loop verdict, as the scripts write it

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
    loop_local: int = 0  # loop checks answered from the view (refused or allowed)
    loop_round_trips: int = 0  # loop checks left to the store: view not trusted, or full
    stale: int = 0  # announcements heard after this process's own reset, forgive or forget


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


class _Unheard:
    """This process's own closes (of a key: reset or forgive; of a call: forget) whose
    announcement the subscriber thread has not heard yet: what the thread hears of a name
    before that is older than the close, and is ignored.

    A close not heard within ``STALE_AFTER`` seconds stops hiding anything: by then the view
    has heard from the server since the close, or it is not trusted and syncs again (which
    forgets every close: ``clear``). At most ``MAX_LOOPS`` closes are kept, the oldest dropped.
    """

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._closes: dict[Any, tuple[int, float]] = {}  # name -> (closes unheard, until)
        self._lock = threading.Lock()  # request threads close, the subscriber thread hears
        self._now = now

    def closed(self, name: Any) -> None:
        with self._lock:
            unheard = self._closes.pop(name, (0, 0.0))[0]
            if len(self._closes) >= MAX_LOOPS:
                self._closes.pop(next(iter(self._closes)))
            self._closes[name] = (unheard + 1, self._now() + STALE_AFTER)

    def heard(self, name: Any) -> None:
        """The announcement of one close of ``name`` arrived."""
        with self._lock:
            unheard, until = self._closes.pop(name, (0, 0.0))
            if unheard > 1:
                self._closes[name] = (unheard - 1, until)

    def hides(self, name: Any) -> bool:
        """Whether what is heard now of ``name`` is older than a close of this process."""
        if not self._closes:  # the common case: no close waits
            return False
        with self._lock:
            entry = self._closes.get(name)
            if entry is None:
                return False
            if entry[1] < self._now():
                del self._closes[name]
                return False
            return True

    def clear(self) -> None:
        with self._lock:
            self._closes.clear()


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
        # (loops key, fingerprint) -> (until, the check's refusal): the tripped calls
        self._loops: dict[tuple[str, str], tuple[float, LoopVerdict]] = {}
        self._loops_full = False
        self._next_room = 0.0  # monotonic time of the next look for room, while full
        # (loops key, fingerprint) -> (until, failures): calls this process saw fail
        self._failing: dict[tuple[str, str], tuple[float, float]] = {}
        # this process's resets and forgives (keys), and forgotten calls ((loops key,
        # fingerprint or '*')), not heard back yet: older announcements are ignored
        self._closing = _Unheard()
        self._forgetting = _Unheard()
        self._loop_markers = f"{_glob_escape(prefix)}:open-loop:*"
        self._loop_marker_start = len(prefix) + len(":open-loop:")
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

    def answer_loop(self, key: str, fingerprint: str) -> LoopVerdict | None:
        """A ``CheckLoops`` for the call ``fingerprint`` of the loop string ``key`` from the
        view: its refusal while tripped, else allowed (no send counted; ``failures``: those
        this process saw), or None: ask the store (the view is not trusted, or full)."""
        verdict = self.known_loop(key, fingerprint)
        if verdict is None:
            self.counts.loop_round_trips += 1
        return verdict

    def known_loop(self, key: str, fingerprint: str) -> LoopVerdict | None:
        """``answer_loop``, counting no round trip when it has no answer: for a caller that
        then sends the check through ``answer_loop`` (``RedisStore.known``), which counts it."""
        if not self.trusted or (self._loops_full and not self._room_again()):
            self.start()
            return None
        call = (key, fingerprint)
        self.counts.loop_local += 1
        entry = self._loops.get(call)
        seen = self._failing.get(call)
        if entry is None and seen is None:
            return LoopVerdict()  # most calls: never tripped, no failure seen (no clock read)
        now = self._now()
        if entry is not None:
            until, refusal = entry
            if until > now:
                return replace(refusal, retry_after=until - now)
            self._loops.pop(call, None)
        if seen is not None and seen[0] <= now:
            self._failing.pop(call, None)
            seen = None
        return LoopVerdict(failures=seen[1] if seen is not None else 0.0)

    def _room_again(self) -> bool:
        """While full: look for room (expired calls) at most once a second."""
        now = time.monotonic()
        if now < self._next_room:
            return False
        self._next_room = now + 1.0
        return self._loop_room()

    def _loop_room(self) -> bool:
        """Drop the expired tripped calls; whether there is room again."""
        now = self._now()
        for call, (until, _) in list(self._loops.items()):
            if until <= now:
                self._loops.pop(call, None)
        self._loops_full = len(self._loops) >= MAX_LOOPS
        return not self._loops_full

    def _tripped(self, call: tuple[str, str], until: float, refusal: LoopVerdict) -> None:
        if call not in self._loops and len(self._loops) >= MAX_LOOPS and not self._loop_room():
            return  # full: loop checks make a round trip until there is room (_loops_full)
        self._loops[call] = (until, refusal)

    def _forget_loops(self, key: str, fingerprint: str) -> None:
        """Forget one call (``fingerprint``) of ``key``, or all of them (``""``)."""
        for calls in (self._loops, self._failing):
            if fingerprint:
                calls.pop((key, fingerprint), None)
            else:
                for call in list(calls):  # a copy: request threads change the dicts too
                    if call[0] == key:
                        calls.pop(call, None)

    def _learn_loop(self, op: CheckLoops | NoteLoop, key: str, result: object) -> None:
        if not isinstance(result, LoopVerdict):
            return
        call = (key, op.fingerprint)
        now = self._now()
        if result.tripped or (not result.allowed and result.reason == "failure_loop"):
            refusal = replace(result, allowed=False, tripped=False, retry_after=0.0)
            self._tripped(call, now + result.retry_after, refusal)
        elif result.allowed and type(op) is CheckLoops:
            self._loops.pop(call, None)  # the cooldown ran out, or another process forgot it
        if type(op) is NoteLoop:
            if op.failed is False:
                self._failing.pop(call, None)  # the store ended every failure of the call
            elif op.failed and not result.tripped:
                if call not in self._failing and len(self._failing) >= MAX_LOOPS:
                    oldest = next(iter(list(self._failing)), None)  # its success goes unnoted
                    if oldest is not None:
                        self._failing.pop(oldest, None)
                self._failing[call] = (now + op.policy.failure_window, result.failures)

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
            self._closing.closed(key)
        elif kind is CheckLoops or kind is NoteLoop:
            self._learn_loop(op, key, result)  # type: ignore[arg-type]
        elif kind is NoteLoopBatch and isinstance(result, list):
            for note, verdict in zip(op.notes, result, strict=False):  # type: ignore[attr-defined]
                self._learn_loop(note, key, verdict)
        elif kind is ForgetLoops:
            fingerprint = op.fingerprint  # type: ignore[attr-defined]
            self._forget_loops(key, fingerprint)
            self._forgetting.closed((key, fingerprint or "*"))

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
                if self._closing.hides(key):
                    self.counts.stale += 1
                else:
                    self._opened(key, float(fields[0]), fields[1:-1])
        elif kind == "c":
            self._closing.heard(rest)
            if self._announced(rest):
                self._open.pop(rest, None)
        elif kind == "l":
            # '<open_until> <fingerprint> <the check's refusal: 10 fields> <loops key>'
            fields = rest.split(" ", _LOOP_FIELDS + 2)
            if len(fields) == _LOOP_FIELDS + 3:
                key = fields[-1]
                call = (key, fields[1])
                if self._forgetting.hides(call) or self._forgetting.hides((key, "*")):
                    self.counts.stale += 1
                else:
                    self._loop_opened(key, fields[1], float(fields[0]), " ".join(fields[2:-1]))
        elif kind == "f":
            fingerprint, _, key = rest.partition(" ")
            self._forgetting.heard((key, fingerprint))
            self._forget_loops(key, "" if fingerprint == "*" else fingerprint)
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

    def _loop_opened(self, key: str, fingerprint: str, open_until: float, text: str) -> None:
        refusal = loop_verdict_of(text)
        # as _opened: the store's clock frame, or the time left from now on this host's clock
        until = open_until if self._clock is not None else self._now() + refusal.retry_after
        self._tripped((key, fingerprint), until, replace(refusal, retry_after=0.0))

    def _sync(self, client: Any) -> None:
        """Read every marker (SCAN on every primary), then trust the view."""
        self._trusted = False
        # The markers read next are the truth: a close made before them is in them.
        self._closing.clear()
        self._forgetting.clear()
        found: dict[str, tuple[float, Refusal | None]] = {}
        server_now = None if self._clock is not None else _server_time(client)
        tripped_before = set(self._loops)  # a trip this process marks meanwhile stays
        names = list(client.scan_iter(match=self._markers, count=1000))
        values = _values(client, names)
        loop_names = list(client.scan_iter(match=self._loop_markers, count=1000))
        loop_values = _values(client, loop_names)
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
        self._sync_loops(loop_names, loop_values, tripped_before, server_now, now)
        self._heard = time.monotonic()
        self._trusted = True
        self.counts.syncs += 1
        self._synced.set()
        self._notify()
        logger.debug("tokenfuse: open-key view of %r synced (%d open)", self._prefix, len(found))

    def _sync_loops(
        self,
        names: list[Any],
        values: list[Any],
        tripped_before: set[tuple[str, str]],
        server_now: float | None,
        now: float,
    ) -> None:
        """The tripped calls are what the markers say (plus this process's trips meanwhile)."""
        found: dict[tuple[str, str], tuple[float, LoopVerdict]] = {}
        for name, value in zip(names, values, strict=True):
            if value is None:
                continue
            open_until, _, text = _text(value).partition(" ")
            until = float(open_until)
            until = until if server_now is None else now + (until - server_now)
            tagged = _text(name)[self._loop_marker_start :]  # '{<key>}:<fingerprint>'
            fingerprint = tagged[-FINGERPRINT_LENGTH:]
            key = f"{self._prefix}:loops:{tagged[: -FINGERPRINT_LENGTH - 1]}"
            if until > now:
                found[(key, fingerprint)] = (until, replace(loop_verdict_of(text), retry_after=0.0))
        for call in tripped_before - found.keys():
            self._loops.pop(call, None)
        for call, (until, refusal) in found.items():
            self._tripped(call, until, refusal)

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
