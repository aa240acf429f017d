"""Admission from leases: a hot caller's calls decided in this process, not in the store.

``Leases`` answers ``admit`` / ``aadmit`` like ``Fuse`` (``TokenFuse(..., lease=True)`` puts
it in front of the middleware's fuse). The policy is ``_core/lease.py``'s, the store side the
``Lease`` / ``ReturnLease`` operations; here are the locks, the clock and the I/O:

* **A call with a lease** to spend from is decided here, under one lock, with no I/O.
* **The call that finds none** (spent, expired, taken under another bucket policy, or
  invalidated by a ``reset`` / ``set_bucket`` made through this fuse) renews it: one ``Lease``
  round trip that gives back what was left, records the calls the old lease admitted, decides
  this call exactly as ``Admit`` would and takes the next lease. Calls of the same caller that
  arrive meanwhile wait for it, at most ``LeasePolicy.wait``, then are decided directly (one
  ``Admit`` each): a renewal never holds a call longer than that.
* **Top-ups** (asyncio callers, ``LeasePolicy.top_up``): once 3/4 of a lease is spent, a task
  tops it up off the callers' path, so a busy caller rarely meets an empty lease.
* **A refusal** learned from the store (an empty bucket, an open latch) is answered here until
  its ``retry_after`` runs out, at most ``lifetime``: a refused caller hammering its limit costs
  no round trip per call either.
* **A lease that expires** unused is given back by a sweeper (a daemon thread, or a task with
  an asyncio-only store) every half ``lifetime``; ``close()`` / ``aclose()`` give every lease
  back: ``TokenFuse`` calls it at the ASGI lifespan's shutdown, and an ``atexit`` hook at the
  process's exit for a store with a sync face (``TokenFuseWSGI``).
* **The store failing** is the direct mode's failure exactly: a renewal that fails goes through
  ``Fuse``'s handling (fail open, or closed if so configured; counted in ``fuse.health``,
  logged, an event). A lease already held is spent as usual: its tokens were granted.

* **Another process's change** (a trip, ``reset``, ``set_bucket``) is announced on the
  open-key channel: with a ``RedisStore`` whose view is subscribed, the caller's lease is
  renewed at its next call; without (no view, a lost subscription) at its next renewal, at
  most ``lifetime`` later.

What it gives up: up to ``processes * LeasePolicy.largest`` beyond ``capacity + rate * T``
in any ``T`` seconds (``_core/lease.py``), and that staleness.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from ._core.bucket import BucketPolicy, BucketVerdict
from ._core.lease import (
    LeasePolicy,
    LeaseVerdict,
    LocalLease,
    next_size,
    spend,
    wants_top_up,
)
from ._core.velocity import VelocityVerdict
from ._errors import StoreUnavailable
from ._events import FuseEvent, logger
from ._fuse import Decision, Fuse, Who, _admission_numbers
from ._identity import Identity
from ._observe import WATCHERS, decided
from ._stores.open_keys import OpenKeys
from ._stores.ops import Admit, Lease, ReturnLease
from ._throttle import Throttle

__all__ = ["LeaseCounts", "Leases"]


@dataclass(slots=True)
class LeaseCounts:
    """What the leases of one ``Leases`` did since it was made.

    >>> LeaseCounts().local
    0
    """

    local: int = 0  # calls admitted from a lease, with no round trip
    refused_locally: int = 0  # calls refused from a refusal the store gave within retry_after
    renewals: int = 0  # Lease round trips (each also decides one call)
    top_ups: int = 0  # Lease round trips in the background, before the lease runs out (asyncio)
    direct: int = 0  # calls decided by one Admit: a renewal took longer than wait, or no room
    returns: int = 0  # leases given back (expired, invalidated, or closed)
    returned: float = 0.0  # tokens given back
    lost: int = 0  # leases whose return failed (their tokens and amounts are lost)


@dataclass(slots=True)
class _Slot:
    """One caller's lease in this process, and who is renewing it."""

    identity: Identity
    key_id: str
    lease: LocalLease | None = None
    refusal: Decision | None = None  # answered until refused_until (this clock)
    refused_until: float = 0.0
    renewing: threading.Event | asyncio.Future[None] | None = None
    renewing_since: float = 0.0
    pending: list[float] = field(default_factory=list)  # amounts of a failed renewal


#: Seconds after which a renewal still in flight counts as abandoned (its event loop was closed
#: under it) and another call may renew: far beyond any store call's budget.
ABANDONED = 30.0


def _ours(renewing: threading.Event | asyncio.Future[None]) -> bool:
    """Whether this thread can wait for ``renewing``: a sync renewal from a thread, a task's
    from a task of the same event loop."""
    if isinstance(renewing, threading.Event):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return True
        return False
    try:
        return renewing.get_loop() is asyncio.get_running_loop()
    except RuntimeError:
        return False


# What one step under the lock decided: a decision, or what to do for one.
_RENEW, _WAIT, _DIRECT, _TOP_UP = "renew", "wait", "direct", "top up"


class Leases:
    """Admission for ``fuse`` from leases of its callers' buckets (``LeasePolicy``).

    >>> leases = Leases(inbound_fuse(RedisStore.from_url(url)), LeasePolicy())  # doctest: +SKIP
    >>> leases.admit("agent-42").allowed                                        # doctest: +SKIP
    True
    """

    def __init__(
        self,
        fuse: Fuse,
        policy: LeasePolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        background: bool = True,
    ) -> None:
        """``clock``: when leases expire (tests inject theirs); ``background=False``: no
        sweeper, expired leases go back only by ``sweep()`` / ``asweep()`` (tests)."""
        self.fuse = fuse
        self.policy = policy or LeasePolicy()
        self.counts = LeaseCounts()
        self._clock = clock
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {}
        self._sweeper: threading.Thread | asyncio.Task[None] | None = None
        self._stop = threading.Event()
        self._background = background
        self._tasks: set[asyncio.Task[None]] = set()  # top-ups in flight
        self._log = Throttle(60.0)
        fuse.on_event(_invalidator(weakref.ref(self)))
        # A store with an open-key view (RedisStore) announces trips, resets and live
        # overrides made by any process: the lease of that caller is renewed at its next call.
        view = getattr(fuse.store, "open_keys", None)
        if isinstance(view, OpenKeys):
            prefix = getattr(fuse.store, "prefix", "")
            view.listeners.append(_announced(weakref.ref(self), f"{prefix}:{{"))
            view.start()
        if fuse.has_sync:
            atexit.register(_close_at_exit, weakref.ref(self))

    def __repr__(self) -> str:
        return f"Leases({self.fuse!r}, {self.policy!r}, held={len(self._slots)})"

    # -- admission: Fuse.admit's signature ------------------------------------------------------

    def admit(
        self,
        who: Who,
        *,
        cost: float = 1.0,
        amount: float = 1.0,
        bucket: BucketPolicy | None = None,
    ) -> Decision:
        """``Fuse.admit``, from this process's lease of the caller's bucket when it can."""
        identity = Identity.of(who)
        policy = bucket or self.fuse.bucket
        if policy is None:
            return self.fuse.admit(identity, cost=cost, amount=amount, bucket=bucket)
        cost, amount = _admission_numbers(cost, amount)
        key = self.fuse._key(identity)
        started = perf_counter() if WATCHERS.decisions else 0.0
        step = self._step(key, identity, policy, cost, amount, wait=True)
        if isinstance(step, tuple) and step[0] == _WAIT:
            waiting = step[1]
            if isinstance(waiting, threading.Event):
                waiting.wait(self.policy.wait)
            step = self._step(key, identity, policy, cost, amount, wait=False)
        if isinstance(step, Decision):
            if started:
                self._observed(Admit(key, cost, amount, self.fuse.velocity, policy), step, started)
            return step
        if step[0] == _RENEW:
            self._start_sweeper(sync=True)
            return self._renew(key, step[1], step[2])
        return self.fuse.admit(identity, cost=cost, amount=amount, bucket=bucket)

    async def aadmit(
        self,
        who: Who,
        *,
        cost: float = 1.0,
        amount: float = 1.0,
        bucket: BucketPolicy | None = None,
    ) -> Decision:
        """``Fuse.aadmit``, from this process's lease of the caller's bucket when it can."""
        identity = Identity.of(who)
        policy = bucket or self.fuse.bucket
        if policy is None:
            return await self.fuse.aadmit(identity, cost=cost, amount=amount, bucket=bucket)
        cost, amount = _admission_numbers(cost, amount)
        key = self.fuse._key(identity)
        started = perf_counter() if WATCHERS.decisions else 0.0
        step = self._step(key, identity, policy, cost, amount, wait=True, asynchronous=True)
        if isinstance(step, tuple) and step[0] == _WAIT:
            waiting = step[1]
            if isinstance(waiting, asyncio.Future):
                with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(waiting), self.policy.wait)
            step = self._step(key, identity, policy, cost, amount, wait=False, asynchronous=True)
        if isinstance(step, tuple) and step[0] == _TOP_UP:
            _, step, slot, op = step
            task = asyncio.get_running_loop().create_task(self._top_up(slot, op))
            self._tasks.add(task)  # held until done: the loop keeps only a weak reference
            task.add_done_callback(self._tasks.discard)
        if isinstance(step, Decision):
            if started:
                self._observed(Admit(key, cost, amount, self.fuse.velocity, policy), step, started)
            return step
        if step[0] == _RENEW:
            self._start_sweeper(sync=False)
            return await self._arenew(key, step[1], step[2])
        return await self.fuse.aadmit(identity, cost=cost, amount=amount, bucket=bucket)

    def _observed(self, op: Admit, decision: Decision, started: float) -> None:
        """Report a decision made here to the process's observers (metrics), as the ``admit``
        it stands for: the decisions and refusals a dashboard counts stay the same in lease
        mode (the renewals are counted as ``lease``)."""
        watchers = WATCHERS.decisions
        if watchers:
            decided(watchers, self.fuse, op, decision, perf_counter() - started)

    # -- one step under the lock -----------------------------------------------------------------

    def _step(
        self,
        key: str,
        identity: Identity,
        policy: BucketPolicy,
        cost: float,
        amount: float,
        *,
        wait: bool,
        asynchronous: bool = False,
    ) -> Any:
        """A decision from the lease, or (``_RENEW``, slot, op): this call renews it, or
        (``_WAIT``, what to wait on), or (``_DIRECT``,): decide it with one ``Admit``."""
        now = self._clock()
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                if len(self._slots) >= self.policy.max_keys:
                    self.counts.direct += 1
                    return (_DIRECT,)
                slot = self._slots[key] = _Slot(identity, self.fuse._id(identity))
            lease = slot.lease
            if lease is not None and lease.policy is policy and spend(lease, cost, amount, now):
                self.counts.local += 1
                decision = self._local(slot, lease)
                if (
                    asynchronous
                    and self.policy.top_up
                    and slot.renewing is None
                    and wants_top_up(lease)
                ):
                    slot.renewing = asyncio.get_running_loop().create_future()
                    slot.renewing_since = now
                    self.counts.top_ups += 1
                    return (_TOP_UP, decision, slot, self._top_up_op(key, lease, now))
                return decision
            if slot.refusal is not None and now < slot.refused_until:
                self.counts.refused_locally += 1
                return slot.refusal
            if slot.renewing is not None and now - slot.renewing_since < ABANDONED:
                if wait and _ours(slot.renewing):
                    return (_WAIT, slot.renewing)
                self.counts.direct += 1
                return (_DIRECT,)
            # No renewal in flight (or one whose event loop went away without finishing it).
            slot.renewing_since = now
            slot.renewing = (
                asyncio.get_running_loop().create_future() if asynchronous else threading.Event()
            )
            op = self._lease_op(key, slot, policy, cost, amount, now)
            self.counts.renewals += 1
            return (_RENEW, slot, op)

    def _lease_op(
        self, key: str, slot: _Slot, policy: BucketPolicy, cost: float, amount: float, now: float
    ) -> Lease:
        """The renewal of ``slot``'s lease; takes the old lease out of the slot (lock held)."""
        lease, slot.lease = slot.lease, None
        pending = slot.pending
        give_back = 0.0
        if lease is not None:
            pending = pending + lease.pending
            give_back = lease.tokens
        slot.pending = []
        slot.refusal = None
        want = next_size(lease, self.policy, now)
        velocity = self.fuse.velocity
        return Lease(key, cost, amount, want, give_back, tuple(pending), velocity, policy)

    def _top_up_op(self, key: str, lease: LocalLease, now: float) -> Lease:
        """A renewal of ``lease`` that decides no call (cost 0) and asks for what would bring it
        to its next size; takes its pending amounts with it (lock held)."""
        lease.topped = True
        pending, lease.pending = tuple(lease.pending), []
        want = max(next_size(lease, self.policy, now) - lease.tokens, 0.0)
        return Lease(key, 0.0, 0.0, want, 0.0, pending, self.fuse.velocity, lease.policy)

    def _local(self, slot: _Slot, lease: LocalLease) -> Decision:
        remaining = min(lease.capacity, lease.remaining + lease.tokens)
        verdict = BucketVerdict(True, remaining, lease.capacity, lease.rate, 0.0)
        return Decision(key=slot.identity.label, key_id=slot.key_id, allowed=True, bucket=verdict)

    # -- renewing: one Lease round trip through Fuse's decision and failure handling -------------

    def _renew(self, key: str, slot: _Slot, op: Lease) -> Decision:
        started = self._clock()
        installed: list[bool] = []
        try:
            return self.fuse._decide(
                slot.identity, op, self._installer(slot, op, started, installed)
            )
        finally:
            self._renewed(slot, op, installed)

    async def _arenew(self, key: str, slot: _Slot, op: Lease) -> Decision:
        started = self._clock()
        installed: list[bool] = []
        try:
            return await self.fuse._adecide(
                slot.identity, op, self._installer(slot, op, started, installed)
            )
        finally:
            self._renewed(slot, op, installed)

    def _installer(
        self, slot: _Slot, op: Lease, started: float, installed: list[bool]
    ) -> Callable[[Identity, LeaseVerdict], Decision]:
        """What to do with the store's verdict: install the new lease, and decide the call."""

        def install(identity: Identity, verdict: LeaseVerdict) -> Decision:
            installed.append(True)
            fuse = self.fuse
            if verdict.tripped is not None:  # a call the old lease admitted opened the key
                fuse._velocity_decision(identity, verdict.tripped)
            decision = fuse._admit_decision(identity, verdict.admit)
            bucket = verdict.admit.bucket
            with self._lock:
                if decision.allowed and bucket is not None and op.bucket is not None:
                    slot.lease = LocalLease(
                        policy=op.bucket,
                        tokens=verdict.granted,
                        expires=started + self.policy.lifetime,
                        started=started,
                        capacity=bucket.capacity,
                        rate=bucket.rate,
                        remaining=bucket.remaining,
                        size=op.want,
                    )
                elif not decision.allowed and decision.error is not None:
                    wait = min(decision.error.retry_after, self.policy.lifetime)
                    slot.refusal, slot.refused_until = decision, started + wait
            return decision

        return install

    async def _top_up(self, slot: _Slot, op: Lease) -> None:
        """Top the caller's lease up off the callers' path (asyncio). A failure is the fuse's
        (counted, logged, an event); the lease then runs out and is renewed on demand."""
        installed: list[bool] = []
        give_back: list[float] = []
        topper = self._topper(slot, op, installed, give_back)
        try:
            await self.fuse._adecide(slot.identity, op, topper)
        except StoreUnavailable:
            pass  # failing closed: the fuse has counted and reported it; nobody to raise to
        except Exception:
            logger.exception("tokenfuse: a lease top-up failed")
        finally:
            self._renewed(slot, op, installed)
        store = self.fuse._async_store
        if give_back and store is not None:  # the lease was invalidated meanwhile
            try:
                tripped = await store.arun(ReturnLease(op.key, give_back[0], (), None, op.bucket))
            except Exception as exc:
                self._lost(exc)
                return
            self._returned(slot, op.key, give_back[0], tripped)

    def _topper(
        self, slot: _Slot, op: Lease, installed: list[bool], give_back: list[float]
    ) -> Callable[[Identity, LeaseVerdict], Decision]:
        """What to do with a top-up's verdict: add the tokens to the lease if it is still the
        caller's (else give them back); an open latch ends the lease."""

        def install(identity: Identity, verdict: LeaseVerdict) -> Decision:
            installed.append(True)
            fuse = self.fuse
            if verdict.tripped is not None:
                fuse._velocity_decision(identity, verdict.tripped)
            decision = fuse._admit_decision(identity, verdict.admit)
            bucket = verdict.admit.bucket
            now = self._clock()
            with self._lock:
                lease = slot.lease
                live = lease is not None and lease.expires != float("-inf")
                if lease is None or not live or lease.policy is not op.bucket:
                    if verdict.granted > 0.0:
                        give_back.append(verdict.granted)
                elif not decision.allowed:  # the latch is open (a cost of 0 is always there)
                    lease.expires = float("-inf")
                    if decision.error is not None:
                        wait = min(decision.error.retry_after, self.policy.lifetime)
                        slot.refusal, slot.refused_until = decision, now + wait
                elif bucket is not None:
                    slot.lease = LocalLease(
                        policy=lease.policy,
                        tokens=lease.tokens + verdict.granted,
                        expires=now + self.policy.lifetime,
                        started=now,
                        capacity=bucket.capacity,
                        rate=bucket.rate,
                        remaining=bucket.remaining,
                        size=lease.tokens + op.want,
                        pending=lease.pending,
                        topped=verdict.granted < op.want,  # the bucket runs dry: no more
                    )
            return decision

        return install

    def _renewed(self, slot: _Slot, op: Lease, installed: list[bool]) -> None:
        """The renewal is over: wake who waits for it; after a failure, keep its amounts."""
        with self._lock:
            if not installed:  # the store failed or was skipped: record the amounts next time
                slot.pending = list(op.pending)[-1000:]
            renewing, slot.renewing = slot.renewing, None
        if isinstance(renewing, threading.Event):
            renewing.set()
        elif isinstance(renewing, asyncio.Future) and not renewing.done():
            renewing.set_result(None)

    # -- giving leases back -----------------------------------------------------------------------

    def _due(self, *, everything: bool) -> list[tuple[_Slot, ReturnLease]]:
        """The leases to give back (expired ones, or all), taken out of their slots."""
        now = self._clock()
        due: list[tuple[_Slot, ReturnLease]] = []
        with self._lock:
            for key, slot in list(self._slots.items()):
                if slot.renewing is not None:
                    continue
                lease = slot.lease
                if not everything and lease is not None and now < lease.expires:
                    continue
                if not everything and slot.refusal is not None and now < slot.refused_until:
                    continue
                del self._slots[key]
                pending = slot.pending + (lease.pending if lease else [])
                tokens = lease.tokens if lease else 0.0
                if tokens > 0.0 or pending:
                    policy = lease.policy if lease else self.fuse.bucket
                    op = ReturnLease(key, tokens, tuple(pending), self.fuse.velocity, policy)
                    due.append((slot, op))
        return due

    def sweep(self, *, everything: bool = False) -> int:
        """Give back the leases that expired (``everything``: all of them); how many."""
        store = self.fuse._sync_store
        if store is None:
            return 0
        # One script call each, not a pipeline: returns are rare, run off the callers' path,
        # and a pipeline of scripts is refused by a Redis Cluster client.
        returned = 0
        for slot, op in self._due(everything=everything):
            try:
                tripped = store.run(op)
            except Exception as exc:
                self._lost(exc)
                continue
            returned += self._returned(slot, op.key, op.give_back, tripped)
        return returned

    async def asweep(self, *, everything: bool = False) -> int:
        """``sweep`` for asyncio code."""
        store = self.fuse._async_store
        if store is None:
            return 0
        returned = 0
        for slot, op in self._due(everything=everything):
            try:
                tripped = await store.arun(op)
            except Exception as exc:
                self._lost(exc)
                continue
            returned += self._returned(slot, op.key, op.give_back, tripped)
        return returned

    def _returned(
        self, slot: _Slot, key: str, tokens: float, tripped: VelocityVerdict | None
    ) -> int:
        with self._lock:
            self.counts.returns += 1
            self.counts.returned += tokens
        if tripped is not None:
            self.fuse._velocity_decision(slot.identity, tripped)  # the trip's event
        return 1

    def _lost(self, exc: Exception) -> None:
        with self._lock:
            self.counts.lost += 1
        if self._log.take() is not None:
            logger.warning(
                "tokenfuse: a lease was not given back (store unavailable: %s): its unspent "
                "tokens are lost and its calls not recorded in the velocity window "
                "(%d leases so far)",
                exc, self.counts.lost,
            )  # fmt: skip

    def close(self) -> None:
        """Stop the sweeper and give every lease back."""
        self._stop.set()
        self.sweep(everything=True)

    async def aclose(self) -> None:
        """``close`` for asyncio code."""
        self._stop.set()
        task = self._sweeper
        if isinstance(task, asyncio.Task):
            task.cancel()
        await self.asweep(everything=True)

    # -- the sweeper -----------------------------------------------------------------------------

    def _start_sweeper(self, *, sync: bool) -> None:
        if self._stop.is_set() or not self._background:
            return
        with self._lock:  # renewals only: rare enough for the lock
            sweeper = self._sweeper
            if sweeper is not None and not (isinstance(sweeper, asyncio.Task) and sweeper.done()):
                return  # running (a task ends with its event loop: then another starts)
            if self.fuse.has_sync:
                self._sweeper = threading.Thread(
                    target=_sweep_thread,
                    args=(weakref.ref(self), self._stop, self.policy.lifetime / 2),
                    name=f"tokenfuse-leases:{self.fuse.name}",
                    daemon=True,
                )
                self._sweeper.start()
            elif not sync:
                self._sweeper = asyncio.get_running_loop().create_task(
                    _sweep_task(weakref.ref(self), self._stop, self.policy.lifetime / 2)
                )

    def invalidate(self, key_id: str) -> None:
        """Renew the lease of the caller with ``key_id`` at its next call (its bucket was
        reset or changed): what it held goes back then."""
        with self._lock:
            for slot in self._slots.values():
                if slot.key_id == key_id:
                    _expire(slot)

    def invalidate_key(self, key: str) -> None:
        """``invalidate`` for the caller whose store key (``Fuse._key``) is ``key``."""
        with self._lock:
            slot = self._slots.get(key)
            if slot is not None:
                _expire(slot)


def _expire(slot: _Slot) -> None:
    """The next call renews the lease, and asks the store instead of a cached refusal."""
    if slot.lease is not None:
        slot.lease.expires = float("-inf")
    slot.refusal = None


def _sweep_thread(ref: weakref.ref[Leases], stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        leases = ref()
        if leases is None:
            return
        try:
            leases.sweep()
        except Exception:  # never let the sweeper die: it is the leases' way back
            logging.getLogger("tokenfuse").exception("tokenfuse: lease sweep failed")
        del leases


async def _sweep_task(ref: weakref.ref[Leases], stop: threading.Event, every: float) -> None:
    while not stop.is_set():
        await asyncio.sleep(every)
        leases = ref()
        if leases is None:
            return
        try:
            await leases.asweep()
        except Exception:
            logging.getLogger("tokenfuse").exception("tokenfuse: lease sweep failed")
        del leases


#: The fuse's events after which a caller's lease is renewed at its next call: a trip (by a
#: ``record`` of the tokens a handler reported), a reset, a live change.
_RENEW_ON = frozenset({"tripped", "reset", "forgiven", "configured"})


def _invalidator(ref: weakref.ref[Leases]) -> Callable[[FuseEvent], None]:
    """A fuse hook: a trip, reset or live change made through this fuse renews the lease."""

    def hook(event: FuseEvent) -> None:
        leases = ref()
        if leases is not None and event.key_id and event.kind in _RENEW_ON:
            leases.invalidate(event.key_id)

    return hook


def _announced(ref: weakref.ref[Leases], start: str) -> Callable[[str, str], None]:
    """An open-key listener: a trip, reset or live change of a caller (``<prefix>:{<key>}``)
    announced by any process renews its lease at its next call."""

    def listener(kind: str, redis_key: str) -> None:
        leases = ref()
        if leases is not None and redis_key.startswith(start) and redis_key.endswith("}"):
            leases.invalidate_key(redis_key[len(start) : -1])

    return listener


def _close_at_exit(ref: weakref.ref[Leases]) -> None:
    leases = ref()
    if leases is not None and not leases._stop.is_set():
        try:
            leases.close()
        except Exception:  # the store may be gone at exit: the tokens are lost, not more
            logger.debug("tokenfuse: leases not given back at exit", exc_info=True)
