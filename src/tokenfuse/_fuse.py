"""``Fuse``: the one facade the transport and the middleware share.

It turns identities into storage-safe keys (keyed with the deployment secret), builds each
step's store operation (``_stores.ops``) and runs it in the store (one round trip), turns
verdicts into typed refusals, reports events, and fails open when the store is down. Sync
methods are plain (``record``), async ones carry an ``a`` prefix (``arecord``); both build the
same operation and go through the same verdict handling, and only the store call itself
differs (``run`` or ``arun``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from math import inf  # a constant: float("inf") parses its string on every call
from time import perf_counter
from typing import Any, NamedTuple, TypeVar

from ._core.admission import AdmitVerdict
from ._core.bucket import BucketPolicy, BucketVerdict
from ._core.rates import per_minute, per_second
from ._core.status import Status
from ._core.velocity import VelocityPolicy, VelocityVerdict
from ._errors import (
    CeilingExceeded,
    ConfigurationError,
    FuseTripped,
    LoopSuspected,
    QuotaExhausted,
    StoreBusy,
    StoreUnavailable,
)
from ._events import EventKind, FuseEvent, Hook, Hooks, logger
from ._health import StoreHealth
from ._identity import Identity
from ._observe import WATCHERS, decided, store_failed
from ._observe import apply as apply_settings
from ._secret import SecretSource, deployment_secret
from ._settings import current as current_settings
from ._stats import FuseStats
from ._stores.base import AsyncStore, SyncStore, async_face, sync_face
from ._stores.event_log import EventLog
from ._stores.memory import MemoryStore
from ._stores.ops import (
    UNSET,
    Admit,
    Configure,
    Forgive,
    Gate,
    Op,
    ReadStatus,
    Record,
    RecordBatch,
    Reset,
    Unset,
)

__all__ = ["Decision", "Fuse", "Status", "checked_overrides", "default_fuse"]

T = TypeVar("T")
Who = str | Identity

_DEFAULT_VELOCITY = VelocityPolicy()
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class _Names(NamedTuple):
    """What a fuse calls one identity: its store key (under the fuse's name, ``fuse``) and its
    key id, both from the identity's keyed hash (never the credential itself)."""

    identity: Identity | None
    fuse: str
    key: str
    key_id: str


_NO_NAMES = _Names(None, "", "", "")


# Not frozen: built on every guarded call, and frozen dataclasses pay a setattr per field.
@dataclass(slots=True)
class Decision:
    """The outcome of one guarded step.

    ``error`` is the ready-to-raise refusal when ``allowed`` is False. ``tripped`` means this
    very step opened the key (the next call will be refused). ``degraded`` means the store was
    unavailable and the fuse failed open: nothing was checked. ``key`` is the identity's
    label, ``key_id`` its short, non-secret id.
    """

    key: str
    allowed: bool
    key_id: str | None = None
    error: FuseTripped | None = None
    tripped: bool = False
    rate: float = 0.0
    limit: float | None = None
    baseline: float | None = None
    multiple: float | None = None
    bucket: BucketVerdict | None = None
    degraded: bool = False

    def raise_if_refused(self) -> None:
        if self.error is not None and not self.allowed:
            raise self.error


class Fuse:
    """Policies, a store and event hooks: everything a guarded call consults.

    >>> fuse = Fuse()                                   # embedded store, default policy
    >>> fuse.record("agent-42", 1_200).allowed
    True
    >>> fuse.status("agent-42").rate
    1200.0

    Args:
        store: ``MemoryStore()`` by default; ``RedisStore.from_url(...)`` to share state.
        name: namespace of this fuse's keys, so fuses counting different things (tokens
            outbound, calls inbound) can share a store.
        velocity: the velocity policy (``None`` turns the velocity check off).
        bucket: the token bucket for ``admit`` (``None``: no bucket).
        fail_closed: raise ``StoreUnavailable`` instead of failing open.
        on_event: a hook or hooks called with every ``FuseEvent``.
        secret: the deployment secret store keys and key ids are derived with (at least 16
            characters; every process sharing the store must use the same). Default:
            ``TOKENFUSE_SECRET``; without it, a per-process one on ``MemoryStore`` and a
            public fallback, with a warning, on shared stores (``docs/identities.md``).

    ``fuse.stats`` (a ``FuseStats``) counts the calls whose usage was estimated, unknown or
    partial, for the process and per key.
    """

    def __init__(
        self,
        store: SyncStore | AsyncStore | None = None,
        *,
        name: str = "default",
        velocity: VelocityPolicy | None = _DEFAULT_VELOCITY,
        bucket: BucketPolicy | None = None,
        fail_closed: bool = False,
        on_event: Hook | Iterable[Hook] | None = None,
        health: StoreHealth | None = None,
        secret: SecretSource | None = None,
    ) -> None:
        if not _NAME.match(name):
            raise ConfigurationError(f"fuse name must match {_NAME.pattern}, not {name!r}")
        self.store = store if store is not None else MemoryStore()
        # Never an attribute a repr or a debugger dump shows by name.
        self._secret = deployment_secret(secret, shared=not isinstance(self.store, MemoryStore))
        self.name = name
        self._names = _NO_NAMES  # the last identity's (``_key``, ``_id``)
        self.velocity = velocity
        self.bucket = bucket
        self.fail_closed = fail_closed
        self.hooks = Hooks(on_event)
        self.health = health or StoreHealth()
        self.stats = FuseStats()
        self._velocity_for_reads = velocity or _DEFAULT_VELOCITY
        # Protocol isinstance checks are slow; decide once which faces the store has.
        self._sync_store = sync_face(self.store)
        self._async_store = async_face(self.store)
        #: What the store answers of an operation without a round trip (``RedisStore.known``:
        #: its open-key view), or None: a store that answers nothing so.
        self._known: Callable[[Op[Any]], Any] | None = getattr(self.store, "known", None)
        log = getattr(self.store, "events", None)
        if isinstance(log, EventLog):  # every process sharing the store sees these events
            self.hooks.add(log.recorder(name))
        apply_settings(current_settings())  # the process's observers (metrics, alerts)

    def __repr__(self) -> str:
        return f"Fuse(store={self.store!r}, name={self.name!r})"

    def key_id(self, who: Who) -> str:
        """The short, non-secret id this fuse shows for ``who`` in refusals and events.

        >>> fuse = Fuse(secret="an example secret, 32 characters")
        >>> fuse.key_id("agent-42")
        '7d6fc5593120'
        """
        return self._id(Identity.of(who))

    def on_event(self, hook: Hook) -> Hook:
        """Add an event hook; usable as a decorator."""
        self.hooks.add(hook)
        return hook

    # -- the steps: each builds its operation and runs it in the store ------------------------

    def gate(self, who: Who) -> Decision:
        """Before a call: refuse at once if the key is open. Spends nothing."""
        identity = Identity.of(who)
        return self._decide(identity, Gate(self._key(identity)), self._velocity_decision)

    async def agate(self, who: Who) -> Decision:
        identity = Identity.of(who)
        return await self._adecide(identity, Gate(self._key(identity)), self._velocity_decision)

    def gate_with(self, who: Who, ops: Sequence[Op[Any]]) -> tuple[Decision, list[Any] | None]:
        """``gate``, and ``ops`` in the same round trip (one pipeline): a call's run-budget
        reservations ride with its gate. The gate's decision, and the ops' results (None
        when the store failed: the gate failed open, or closed, as ``gate`` does)."""
        identity = Identity.of(who)
        return self._decide_with(identity, Gate(self._key(identity)), ops, self._velocity_decision)

    async def agate_with(
        self, who: Who, ops: Sequence[Op[Any]]
    ) -> tuple[Decision, list[Any] | None]:
        identity = Identity.of(who)
        gate = Gate(self._key(identity))
        return await self._adecide_with(identity, gate, ops, self._velocity_decision)

    def record_with(
        self, who: Who, amount: float, ops: Sequence[Op[Any]]
    ) -> tuple[Decision, list[Any] | None]:
        """``record``, and ``ops`` in the same round trip: a call's run-budget settlements
        ride with its record."""
        identity = Identity.of(who)
        op = self._record_op(identity, amount)
        if op is None:
            return self._decide(identity, None, self._velocity_decision), self.run_guarded(ops)
        return self._decide_with(identity, op, ops, self._velocity_decision)

    async def arecord_with(
        self, who: Who, amount: float, ops: Sequence[Op[Any]]
    ) -> tuple[Decision, list[Any] | None]:
        identity = Identity.of(who)
        op = self._record_op(identity, amount)
        if op is None:
            decision = await self._adecide(identity, None, self._velocity_decision)
            return decision, await self.arun_guarded(ops)
        return await self._adecide_with(identity, op, ops, self._velocity_decision)

    def record(self, who: Who, amount: float) -> Decision:
        """After a call: add what it spent; the verdict may open the key for the next call."""
        identity = Identity.of(who)
        op = self._record_op(identity, amount)
        return self._decide(identity, op, self._velocity_decision)

    async def arecord(self, who: Who, amount: float) -> Decision:
        identity = Identity.of(who)
        op = self._record_op(identity, amount)
        return await self._adecide(identity, op, self._velocity_decision)

    def record_batch(self, items: Sequence[tuple[Who, float]]) -> list[Decision]:
        """``record`` of many calls at once, in one store round trip: the usage of calls
        recorded off the caller's path (``FuseTransport(record="background")``).

        The amounts of one key go in one ``RecordBatch``, in order, and its calls share the
        decision: the first trip's, else the last record's. One decision per item, in order.
        """
        return self.record_batch_with(items, ())[0]

    def record_batch_with(
        self, items: Sequence[tuple[Who, float]], ops: Sequence[Op[Any]]
    ) -> tuple[list[Decision], list[Any] | None]:
        """``record_batch``, and ``ops`` in the same round trip (the batch's failure-loop
        notes): the decisions, and the ops' results (None when the store failed: counted, and
        failed open or closed, once for the whole batch)."""
        batch = _Batch(self, items)
        sending = [*batch.ops, *ops] if ops else batch.ops
        if not sending:
            return batch.decisions([]), []
        store = self._sync()
        if not self.health.available():
            return batch.degraded(None), None
        try:
            run_many = getattr(store, "run_many", None)
            # One op (the common case when calls are spaced out: a batch of one call) is one
            # plain script call, without a pipeline's making and unmaking.
            if run_many is None or len(sending) == 1:
                results = [store.run(op) for op in sending]
            else:
                results = run_many(sending)
        except Exception as exc:
            return batch.degraded(exc), None
        self._healthy()
        recorded = len(batch.ops)
        return batch.decisions(results[:recorded]), results[recorded:]

    def admit(
        self,
        who: Who,
        *,
        cost: float = 1.0,
        amount: float = 1.0,
        bucket: BucketPolicy | None = None,
    ) -> Decision:
        """Before an inbound call: latch, then bucket (``cost``), then velocity (``amount``).

        ``amount=0`` checks the latch without recording (when the velocity is fed later by
        ``record``, e.g. with the tokens a handler reports). ``bucket`` replaces the fuse's
        bucket policy for this call (a caller's tier); a live override still wins over both.
        """
        identity = Identity.of(who)
        op = self._admit_op(identity, cost, amount, bucket)
        return self._decide(identity, op, self._admit_decision)

    async def aadmit(
        self,
        who: Who,
        *,
        cost: float = 1.0,
        amount: float = 1.0,
        bucket: BucketPolicy | None = None,
    ) -> Decision:
        identity = Identity.of(who)
        op = self._admit_op(identity, cost, amount, bucket)
        return await self._adecide(identity, op, self._admit_decision)

    def admit_with(
        self,
        who: Who,
        ops: Sequence[Op[Any]],
        *,
        cost: float = 1.0,
        amount: float = 1.0,
        bucket: BucketPolicy | None = None,
    ) -> tuple[Decision, list[Any] | None]:
        """``admit``, and ``ops`` in the same round trip (one pipeline): the middleware's
        failure-loop check rides with its admission. The admission's decision, and the ops'
        results (None when the store failed: the admission failed open, or closed, as
        ``admit`` does, and that failure is counted once for the pipeline)."""
        identity = Identity.of(who)
        op = self._admit_op(identity, cost, amount, bucket)
        return self._decide_with(identity, op, ops, self._admit_decision)

    async def aadmit_with(
        self,
        who: Who,
        ops: Sequence[Op[Any]],
        *,
        cost: float = 1.0,
        amount: float = 1.0,
        bucket: BucketPolicy | None = None,
    ) -> tuple[Decision, list[Any] | None]:
        identity = Identity.of(who)
        op = self._admit_op(identity, cost, amount, bucket)
        return await self._adecide_with(identity, op, ops, self._admit_decision)

    # -- inspection and live control: the store's errors reach the caller ----------------------

    def status(self, who: Who) -> Status:
        """The key's rate, baseline, latch and bucket, read without changing anything."""
        identity = Identity.of(who)
        return self._labelled(self._sync().run(self._status_op(identity)), identity)

    async def astatus(self, who: Who) -> Status:
        identity = Identity.of(who)
        return self._labelled(await self._async().arun(self._status_op(identity)), identity)

    def reset(self, who: Who) -> None:
        """Close the key at once, clear its window and escalation, refill its bucket."""
        identity = Identity.of(who)
        self._sync().run(op := Reset(self._key(identity)))
        self._changed(identity, op)

    async def areset(self, who: Who) -> None:
        identity = Identity.of(who)
        await self._async().arun(op := Reset(self._key(identity)))
        self._changed(identity, op)

    def forgive(self, who: Who) -> None:
        """The key's last trip was legitimate: close the key at once, and teach that the rate
        it tripped at is normal at that hour of day (UTC) and the next, for every process
        sharing the store. A nightly job forgiven once passes on the following nights, while
        the same rate at another hour still trips.

        >>> fuse.forgive("nightly-batch")  # doctest: +SKIP
        """
        identity = Identity.of(who)
        self._sync().run(op := Forgive(self._key(identity)))
        self._changed(identity, op)

    async def aforgive(self, who: Who) -> None:
        identity = Identity.of(who)
        await self._async().arun(op := Forgive(self._key(identity)))
        self._changed(identity, op)

    def set_limit(self, who: Who, limit: float | str | None) -> None:
        """Set (or, with None, clear) the key's manual per-minute ceiling, live, for every
        process sharing the store: it is read with the key's state on its next decision.

        While it is set it replaces the cold-start limits for this key, so a busy new key
        need not wait days for its baseline: ``fuse.set_limit("team-key", 500_000)``."""
        identity = Identity.of(who)
        self._sync().run(op := Configure(self._key(identity), limit=_limit(limit)))
        self._changed(identity, op)

    async def aset_limit(self, who: Who, limit: float | str | None) -> None:
        identity = Identity.of(who)
        await self._async().arun(op := Configure(self._key(identity), limit=_limit(limit)))
        self._changed(identity, op)

    def set_bucket(
        self,
        who: Who,
        *,
        rate: float | str | None | Unset = UNSET,
        capacity: float | None | Unset = UNSET,
    ) -> None:
        """Change one caller's bucket live (None restores the policy's value)."""
        identity = Identity.of(who)
        self._sync().run(op := self._bucket_op(identity, rate, capacity))
        self._changed(identity, op)

    async def aset_bucket(
        self,
        who: Who,
        *,
        rate: float | str | None | Unset = UNSET,
        capacity: float | None | Unset = UNSET,
    ) -> None:
        identity = Identity.of(who)
        await self._async().arun(op := self._bucket_op(identity, rate, capacity))
        self._changed(identity, op)

    # -- run budgets (``tokenfuse.run``): several runs' operations, failing open ---------------

    def run_key(self, run_id: str) -> str:
        """The store key of a run: ``run:`` and the keyed hash of its id, the same in every
        process sharing the deployment secret (the id itself never reaches the store)."""
        return f"run:{Identity.named(run_id).keyed(self._secret).hex}"

    def run_guarded(self, ops: Sequence[Op[Any]]) -> list[Any] | None:
        """Run ``ops`` in one round trip (``run_many``); None when the store failed or is being
        skipped: that is counted and reported as every failed decision is, and the caller
        goes on unchecked (or ``StoreUnavailable`` is raised when the fuse fails closed)."""
        store = self._sync()
        if self.health.available():
            try:
                run_many = getattr(store, "run_many", None)
                results = run_many(ops) if run_many else [store.run(op) for op in ops]
            except Exception as exc:
                self._unguarded(ops, exc)
                return None
            self._healthy()
            return results
        self._unguarded(ops, None)
        return None

    async def arun_guarded(self, ops: Sequence[Op[Any]]) -> list[Any] | None:
        """``run_guarded`` for asyncio code."""
        store = self._async()
        if self.health.available():
            try:
                arun_many = getattr(store, "arun_many", None)
                results = (
                    await arun_many(ops) if arun_many else [await store.arun(op) for op in ops]
                )
            except Exception as exc:
                self._unguarded(ops, exc)
                return None
            self._healthy()
            return results
        self._unguarded(ops, None)
        return None

    def _unguarded(self, ops: Sequence[Op[Any]], exc: Exception | None) -> None:
        """The store failed (``exc``) or is skipped: report it as ``_degraded`` does."""
        if exc is not None and ops and WATCHERS.decisions:
            store_failed(WATCHERS.decisions, self, ops[0], exc)
        self._degraded(Identity.named("run"), exc)
        return

    def _changed(self, identity: Identity, op: Reset | Forgive | Configure) -> None:
        """Report a change made by hand: an event, so every operator sees who changed what."""
        self.changed_by_key(identity.label, self._id(identity), op)

    def changed_by_key(self, label: str, key_id: str, op: Reset | Forgive | Configure) -> None:
        """Report a change made by hand to the key with ``key_id`` (``tokenfuse.admin`` changes
        a key found by its id through its store key, with no identity to name it)."""
        if isinstance(op, Reset):
            detail = (
                f"key {label} [id {key_id}] reset: closed, its window cleared, its bucket refilled"
            )
            kind: EventKind = "reset"
        elif isinstance(op, Forgive):
            detail = (
                f"key {label} [id {key_id}] forgiven: closed, and its trip's rate taught as "
                "normal at this hour"
            )
            kind = "forgiven"
        else:
            unit = self._velocity_for_reads.unit
            changes = [
                f"{what} {'back to the policy' if value is None else f'{value:,g}{suffix}'}"
                for what, value, suffix in (
                    ("manual ceiling", op.limit, f" {unit}/min"),
                    ("bucket capacity", op.capacity, ""),
                    ("bucket refill", op.rate, "/s"),
                )
                if not isinstance(value, Unset)
            ]
            detail = f"key {label} [id {key_id}] set: " + ", ".join(changes)
            kind = "configured"
        event = FuseEvent(kind, label, detail, key_id=key_id, fuse=self.name)
        self.hooks.emit(event, logging.INFO)

    # -- the operations ---------------------------------------------------------------------------

    # One guarded call asks for its identity's key or key id about six times (its gate, its
    # loop check, its record, each decision), and calls in a row are mostly one identity's:
    # the last identity's names are kept, one tuple (swapped whole, so a thread never reads
    # one identity's key with another's id), checked by identity (``is``: no hash, no eq).

    def _key(self, identity: Identity) -> str:
        names = self._names
        if names.identity is not identity or names.fuse is not self.name:
            names = self._named(identity)
        return names.key

    def _id(self, identity: Identity) -> str:
        names = self._names
        if names.identity is not identity:
            names = self._named(identity)
        return names.key_id

    def _named(self, identity: Identity) -> _Names:
        keyed = identity.keyed(self._secret)  # the HMAC, cached on the identity
        names = self._names = _Names(identity, self.name, f"{self.name}:{keyed.hex}", keyed.key_id)
        return names

    def _labelled(self, status: Status, identity: Identity) -> Status:
        return replace(status, key=identity.label, key_id=self._id(identity))

    def _record_op(self, identity: Identity, amount: float) -> Record | None:
        """None when there is nothing to record (the amount is not spending)."""
        if self.velocity is None:
            raise ConfigurationError("this fuse has no velocity policy to record against")
        if not _countable(amount):
            return None
        return Record(self._key(identity), amount, self.velocity)

    def _admit_op(
        self, identity: Identity, cost: float, amount: float, bucket: BucketPolicy | None
    ) -> Admit:
        cost, amount = _admission_numbers(cost, amount)
        return Admit(self._key(identity), cost, amount, self.velocity, bucket or self.bucket)

    def _status_op(self, identity: Identity) -> ReadStatus:
        return ReadStatus(self._key(identity), self._velocity_for_reads, self.bucket)

    def _bucket_op(
        self, who: Who, rate: float | str | None | Unset, capacity: float | None | Unset
    ) -> Configure:
        return Configure(
            self._key(Identity.of(who)), rate=_rate(rate), capacity=_capacity(capacity)
        )

    # -- running them ---------------------------------------------------------------------------

    def _sync(self) -> SyncStore:
        if self._sync_store is None:
            raise ConfigurationError(
                f"{self.store!r} is async-only; use the a-prefixed methods (arecord, agate, ...)"
            )
        return self._sync_store

    def _async(self) -> AsyncStore:
        if self._async_store is None:
            raise ConfigurationError(
                f"{self.store!r} is sync-only; use the plain methods (record, gate, ...)"
            )
        return self._async_store

    @property
    def has_sync(self) -> bool:
        """Whether the plain methods can reach the store."""
        return self._sync_store is not None

    @property
    def has_async(self) -> bool:
        """Whether the a-prefixed methods can reach the store."""
        return self._async_store is not None

    def _decide(
        self, identity: Identity, op: Op[T] | None, decide: Callable[[Identity, T], Decision]
    ) -> Decision:
        """Run ``op`` (None: nothing to ask) and decide on its verdict; fail open if the store
        fails (or closed, if so configured)."""
        if op is None:
            return Decision(key=identity.label, allowed=True, key_id=self._id(identity))
        store = self._sync()
        # Metrics: when nothing observes decisions, this check is all they cost.
        started = perf_counter() if WATCHERS.decisions else 0.0
        outcome: T | Exception | None = None  # None: the store is being skipped
        if self.health.available():
            try:
                outcome = store.run(op)
            except Exception as exc:
                outcome = exc
        return self._conclude(identity, op, decide, outcome, started)

    async def _adecide(
        self, identity: Identity, op: Op[T] | None, decide: Callable[[Identity, T], Decision]
    ) -> Decision:
        """``_decide`` for asyncio code: the same steps, awaiting the store."""
        if op is None:
            return Decision(key=identity.label, allowed=True, key_id=self._id(identity))
        store = self._async()
        started = perf_counter() if WATCHERS.decisions else 0.0
        outcome: T | Exception | None = None
        if self.health.available():
            try:
                outcome = await store.arun(op)
            except Exception as exc:
                outcome = exc
        return self._conclude(identity, op, decide, outcome, started)

    def _decide_with(
        self,
        identity: Identity,
        op: Op[T],
        ops: Sequence[Op[Any]],
        decide: Callable[[Identity, T], Decision],
    ) -> tuple[Decision, list[Any] | None]:
        """``_decide`` of ``op`` with ``ops`` after it in one pipeline; their results (None:
        the store failed, and ``op``'s decision says so). No ``ops``: ``op`` alone, as
        ``_decide`` runs it (a gate the open-key view answers costs no round trip)."""
        if not ops:
            return self._decide(identity, op, decide), None
        found = self._known_alone(ops)
        if found is not None:
            decision = self._decide(identity, op, decide)
            return decision, None if decision.degraded else found
        store = self._sync()
        started = perf_counter() if WATCHERS.decisions else 0.0
        outcome: T | Exception | None = None
        rest: list[Any] | None = None
        if self.health.available():
            try:
                run_many = getattr(store, "run_many", None)
                both = [op, *ops]
                results = run_many(both) if run_many else [store.run(each) for each in both]
                outcome, rest = results[0], results[1:]
            except Exception as exc:
                outcome = exc
        return self._conclude(identity, op, decide, outcome, started), rest

    async def _adecide_with(
        self,
        identity: Identity,
        op: Op[T],
        ops: Sequence[Op[Any]],
        decide: Callable[[Identity, T], Decision],
    ) -> tuple[Decision, list[Any] | None]:
        if not ops:
            return await self._adecide(identity, op, decide), None
        found = self._known_alone(ops)
        if found is not None:
            decision = await self._adecide(identity, op, decide)
            return decision, None if decision.degraded else found
        store = self._async()
        started = perf_counter() if WATCHERS.decisions else 0.0
        outcome: T | Exception | None = None
        rest: list[Any] | None = None
        if self.health.available():
            try:
                arun_many = getattr(store, "arun_many", None)
                both = [op, *ops]
                if arun_many:
                    results = await arun_many(both)
                else:
                    results = [await store.arun(each) for each in both]
                outcome, rest = results[0], results[1:]
            except Exception as exc:
                outcome = exc
        return self._conclude(identity, op, decide, outcome, started), rest

    def _known_alone(self, ops: Sequence[Op[Any]]) -> list[Any] | None:
        """The results of ``ops`` when they are one operation the store answers without a
        round trip (the middleware's loop check, answered by the open-key view), else None.
        Then ``op`` goes alone, as ``_decide`` sends it: one plain script call, with none of
        a pipeline's work. Its results are the pipeline's: None when ``op``'s store call
        failed or was skipped (the view's answer is dropped, as a failed pipeline's)."""
        known = self._known
        if known is None or len(ops) != 1:
            return None
        found = known(ops[0])
        return None if found is None else [found]

    def _conclude(
        self,
        identity: Identity,
        op: Op[T],
        decide: Callable[[Identity, T], Decision],
        outcome: T | Exception | None,
        started: float,
    ) -> Decision:
        """The decision on what the store answered (or raised, or None: was not asked)."""
        watchers = WATCHERS.decisions
        if outcome is None:
            decision = self._degraded(identity, None)
        elif isinstance(outcome, Exception):
            if watchers:
                store_failed(watchers, self, op, outcome)
            decision = self._degraded(identity, outcome)
        else:
            # ``_healthy`` inlined: this runs for every decision, and a store that answers
            # (nearly always) has nothing to announce.
            recovered = self.health.succeeded()
            if recovered is not None:
                self.hooks.emit(recovered, logging.INFO)
            decision = decide(identity, outcome)
        if watchers and started:
            decided(watchers, self, op, decision, perf_counter() - started)
        return decision

    def _healthy(self) -> None:
        recovered = self.health.succeeded()
        if recovered is not None:
            self.hooks.emit(recovered, logging.INFO)

    def _degraded(self, identity: Identity, exc: Exception | None) -> Decision:
        """The store failed (or is being skipped): fail open, or closed if so configured."""
        if exc is not None:
            if not isinstance(exc, StoreUnavailable):
                logger.error("tokenfuse store %r raised unexpectedly", self.store, exc_info=exc)
            event = self.health.failed(exc, fail_closed=self.fail_closed)
            if event is not None:
                self.hooks.emit(event)
        if self.fail_closed:
            kind = StoreBusy if isinstance(exc, StoreBusy) else StoreUnavailable
            raise kind(f"tokenfuse store unavailable: {exc or 'backing off'}") from exc
        return Decision(key=identity.label, allowed=True, degraded=True, key_id=self._id(identity))

    def _velocity_decision(
        self, identity: Identity, verdict: VelocityVerdict, bucket: BucketVerdict | None = None
    ) -> Decision:
        """The decision on a velocity verdict (``bucket``: the admission's, carried along)."""
        error = None if verdict.allowed else self._velocity_error(identity, verdict)
        key_id = self._id(identity)
        if verdict.tripped and error is not None:
            event = FuseEvent("tripped", identity.label, str(error), error, key_id=key_id)
            self.hooks.emit(event)
        return Decision(
            key=identity.label,
            key_id=key_id,
            allowed=verdict.allowed,
            error=error,
            tripped=verdict.tripped,
            rate=verdict.rate,
            limit=verdict.limit,
            baseline=verdict.baseline,
            multiple=verdict.multiple,
            bucket=bucket,
        )

    def _velocity_error(self, identity: Identity, verdict: VelocityVerdict) -> FuseTripped:
        reason = verdict.reason or "manual_ceiling"
        refusal = LoopSuspected if reason.startswith("loop_") else CeilingExceeded
        return refusal(
            key=identity.label,
            rate=verdict.rate,
            limit=verdict.limit if verdict.limit is not None else 0.0,
            baseline=verdict.baseline,
            multiple=verdict.multiple,
            retry_after=max(verdict.retry_after, 0.0),
            unit=self._velocity_for_reads.unit,
            reason=reason,
            window=verdict.window,
            key_id=self._id(identity),
        )

    def _admit_decision(self, identity: Identity, verdict: AdmitVerdict) -> Decision:
        bucket = verdict.bucket
        key_id = self._id(identity)
        if bucket is not None and bucket.near_limit:
            detail = (
                f"key {identity.label} [id {key_id}] has used over "
                f"{self.bucket.near_limit_fraction if self.bucket else 0.8:.0%} of its quota "
                f"({bucket.rate:g}/s) for more than "
                f"{self.bucket.near_limit_after if self.bucket else 300:.0f} s"
            )
            self.hooks.emit(FuseEvent("near_limit", identity.label, detail, key_id=key_id))
        if verdict.velocity is not None and not verdict.velocity.allowed:
            return self._velocity_decision(identity, verdict.velocity, bucket)
        if bucket is not None and not bucket.allowed:
            error = QuotaExhausted(
                key=identity.label,
                rate=bucket.rate,
                limit=bucket.capacity,
                retry_after=bucket.retry_after,
                unit="calls",
                key_id=key_id,
            )
            return Decision(
                key=identity.label, key_id=key_id, allowed=False, error=error, bucket=bucket
            )
        if verdict.velocity is None:
            return Decision(key=identity.label, key_id=key_id, allowed=True, bucket=bucket)
        return self._velocity_decision(identity, verdict.velocity, bucket)


class _Batch:
    """The operations of ``Fuse.record_batch``: one ``RecordBatch`` per key, in the order the
    keys first appear, and which items each one decides."""

    def __init__(self, fuse: Fuse, items: Sequence[tuple[Who, float]]) -> None:
        if fuse.velocity is None:
            raise ConfigurationError("this fuse has no velocity policy to record against")
        self.fuse = fuse
        self.identities = [Identity.of(who) for who, _ in items]
        # Grouped by identity (equal identities have equal keys), so that each key is derived
        # once per batch, not once per call: a batch is most often a few keys' many calls.
        groups: dict[Identity, tuple[list[float], list[int]]] = {}
        for at, (identity, (_, amount)) in enumerate(zip(self.identities, items, strict=True)):
            if _countable(amount):
                group = groups.get(identity)
                if group is None:
                    group = groups[identity] = ([], [])
                group[0].append(float(amount))
                group[1].append(at)
        self.groups = [(identity, indexes) for identity, (_, indexes) in groups.items()]
        velocity = fuse.velocity
        self.ops = [
            RecordBatch(fuse._key(identity), tuple(amounts), velocity)
            for identity, (amounts, _) in groups.items()
        ]

    def decisions(self, verdicts: Sequence[VelocityVerdict]) -> list[Decision]:
        """Each item's decision: its key's, or allowed when it recorded nothing."""
        found: list[Decision | None] = [None] * len(self.identities)
        for (identity, indexes), verdict in zip(self.groups, verdicts, strict=True):
            decision = self.fuse._velocity_decision(identity, verdict)
            for at in indexes:
                found[at] = decision
        return [
            Decision(key=identity.label, allowed=True) if decision is None else decision
            for identity, decision in zip(self.identities, found, strict=True)
        ]

    def degraded(self, exc: Exception | None) -> list[Decision]:
        """The store failed (or is skipped): each item fails open (or the batch closed)."""
        first = self.identities[0] if self.identities else Identity.named("batch")
        failed = self.fuse._degraded(first, exc)
        return [replace(failed, key=identity.label) for identity in self.identities]


def _countable(amount: float) -> bool:
    """Only positive finite numbers are spending; anything else records nothing."""
    return isinstance(amount, (int, float)) and 0 < amount < inf


def _admission_numbers(cost: float, amount: float) -> tuple[float, float]:
    if not (isinstance(cost, (int, float)) and 0 <= cost < inf):
        raise ConfigurationError(f"cost must be a finite, non-negative number, not {cost!r}")
    return float(cost), float(amount) if _countable(amount) else 0.0


def _limit(limit: float | str | None) -> float | None:
    return None if limit is None else per_minute(limit, "limit")


def _rate(rate: float | str | None | Unset) -> float | None | Unset:
    if isinstance(rate, Unset) or rate is None:
        return rate
    value = per_second(rate, "rate")
    if value <= 0:
        raise ConfigurationError("bucket rate must be positive")
    return value


def checked_overrides(
    *,
    limit: float | str | None | Unset = UNSET,
    rate: float | str | None | Unset = UNSET,
    capacity: float | None | Unset = UNSET,
) -> Configure:
    """A ``Configure`` of live overrides, each checked as ``set_limit``/``set_bucket`` check it,
    with no key yet (``tokenfuse.admin`` sets it: it may know a key by its store key only)."""
    ceiling = limit if isinstance(limit, Unset) else _limit(limit)
    return Configure("", limit=ceiling, rate=_rate(rate), capacity=_capacity(capacity))


def _capacity(capacity: float | None | Unset) -> float | None | Unset:
    if isinstance(capacity, (int, float)) and not 0 < capacity < inf:
        raise ConfigurationError("bucket capacity must be a positive number")
    return capacity


def default_fuse() -> Fuse:
    """The process-wide fuse that argument-less transports use: the embedded store, or what
    the ``TOKENFUSE_*`` environment or ``tokenfuse.configure`` set (``_settings``)."""
    from ._settings import default_fuses

    return default_fuses()[0]
