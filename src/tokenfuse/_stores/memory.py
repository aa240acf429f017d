"""The embedded default store: the policy core applied to a bounded in-process table."""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from .._core import bucket as _bucket
from .._core import budget as _budget
from .._core import loops as _loops
from .._core import velocity as _velocity
from .._core.admission import AdmitVerdict, admit
from .._core.bucket import BucketPolicy, BucketState
from .._core.budget import RunState, RunVerdict
from .._core.lease import LeaseVerdict, grant, settle
from .._core.loops import LoopState, LoopVerdict
from .._core.status import Status, status_of
from .._core.velocity import VelocityState, VelocityVerdict
from .._errors import ConfigurationError
from .._events import logger
from .event_log import MemoryEventLog
from .ops import (
    Admit,
    CheckLoops,
    Configure,
    ForgetLoops,
    Forgive,
    Gate,
    KeyPage,
    Lease,
    ListKeys,
    NoteLoop,
    NoteLoopBatch,
    Op,
    OpenRun,
    ReadRun,
    ReadState,
    ReadStatus,
    Record,
    RecordBatch,
    Reserve,
    Reset,
    ReturnLease,
    Settle,
    StoredState,
    Unset,
)

__all__ = ["MemoryStore"]

R = TypeVar("R")

#: How many of the least recently used entries an eviction looks at for one without live state.
EVICTION_PROBES = 16

#: At most one warning a minute about evicted live state (the count keeps every one).
_WARN_EVERY = 60.0


@dataclass(slots=True)
class _Entry:
    velocity: VelocityState | None = None
    bucket: BucketState | None = None
    expires: float = 0.0
    # The bucket policy of the key's last admission: what "depleted" means for its bucket.
    bucket_policy: BucketPolicy | None = None
    # The failure-loop breaker's recent calls (``loops``), kept with the identity.
    loops: LoopState | None = None

    def is_live(self, now: float) -> bool:
        """Whether evicting this entry would undo a decision: an open latch, a live override,
        a call the failure-loop breaker refuses, or a bucket drained below half (evicting it
        would hand its caller a full one)."""
        if self.expires <= now:
            return False
        if self.loops is not None and any(call.open_until > now for call in self.loops.calls):
            return True
        velocity, bucket = self.velocity, self.bucket
        if velocity is not None and (velocity.open_until > now or velocity.limit_override >= 0):
            return True
        if bucket is None:
            return False
        if bucket.capacity_override > 0 or bucket.rate_override > 0:
            return True
        if self.bucket_policy is None:
            return False
        capacity, rate = _bucket.limits_of(bucket, self.bucket_policy)
        return _bucket.level(bucket, now, capacity, rate) < capacity / 2


class MemoryStore:
    """State in this process only: zero setup, thread-safe, bounded.

    At most ``max_keys`` identities are held (about 1.75 KB each: the default of 20,000 is
    about 35 MB, room for every caller of a small service). Past that, the least recently used
    entry *without live state* is evicted, so a flood of made-up identities costs a fixed
    amount of memory and cannot erase what matters: an open (tripped) key, a live
    ``set_limit``/``set_bucket``, or a drained bucket stays while ordinary entries remain among
    the ``EVICTION_PROBES`` least recently used. When none does, the oldest goes anyway: that is
    counted in ``live_evictions`` and logged. Entries idle for ``ttl`` seconds expire lazily
    when touched or evicted; no background thread runs.

    >>> store = MemoryStore(max_keys=10_000)
    """

    def __init__(
        self,
        *,
        max_keys: int = 20_000,
        ttl: float = 14 * 86_400.0,
        clock: Callable[[], float] = time.time,
        max_runs: int = 10_000,
    ) -> None:
        if max_keys < 1:
            raise ConfigurationError("max_keys must be at least 1")
        if max_runs < 1:
            raise ConfigurationError("max_runs must be at least 1")
        self.max_runs = max_runs
        #: Runs evicted to make room for others (their budgets start again if they come back).
        self.run_evictions = 0
        self._runs: OrderedDict[str, RunState] = OrderedDict()
        self.max_keys = max_keys
        self.ttl = float(ttl)
        self.clock = clock
        #: Entries evicted to make room, and how many of them held live state.
        self.evictions = 0
        self.live_evictions = 0
        self._next_warning = 0.0
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        #: Operator events (trips, resets, ...) of the fuses using this store, in this process.
        self.events = MemoryEventLog()

    def __len__(self) -> int:
        return len(self._entries)

    def _live(self, key: str, now: float) -> _Entry | None:
        """The key's entry unless it expired, marked most recently used; lock held."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        entry.expires = now + self.ttl
        return entry

    def _entry(self, key: str, now: float) -> _Entry:
        """The key's live entry, a new one if it has none (evicting the least recently used)."""
        entry = self._live(key, now)
        if entry is None:
            entry = self._entries[key] = _Entry(expires=now + self.ttl)
            if len(self._entries) > self.max_keys:
                self._evict(now, keep=key)
        return entry

    def _evict(self, now: float, keep: str) -> None:
        """Drop the least recently used entry without live state, never ``keep`` (the entry
        being made room for); lock held.

        Live entries looked at on the way move to the recent end, so the next eviction does not
        look at them again: evicted last, not never.
        """
        probed = itertools.islice(self._entries.items(), EVICTION_PROBES + 1)
        oldest = [(key, entry) for key, entry in probed if key != keep][:EVICTION_PROBES]
        for key, entry in oldest:
            if not entry.is_live(now):
                del self._entries[key]
                self.evictions += 1
                return
            self._entries.move_to_end(key)
        del self._entries[oldest[0][0]]
        self.evictions += 1
        self.live_evictions += 1
        if now >= self._next_warning:
            self._next_warning = now + _WARN_EVERY
            logger.warning(
                "tokenfuse MemoryStore is full of live state (%d keys, all of the %d oldest open, "
                "overridden or drained): evicted one anyway, %d so far; raise max_keys",
                len(self._entries),
                len(oldest),
                self.live_evictions,
            )

    def run(self, op: Op[R]) -> R:
        """Run one operation (``ops``): under the store's lock, at one reading of its clock."""
        apply = _APPLY[type(op)]
        with self._lock:
            result: R = apply(self, op, self.clock())
        return result

    async def arun(self, op: Op[R]) -> R:
        """``run``: nothing here waits on I/O, so the async face runs the same code directly."""
        return self.run(op)

    def run_many(self, ops: Sequence[Op[Any]]) -> list[Any]:
        """Run several operations, in order (``RedisStore`` sends them as one pipeline): under
        one hold of the lock, at one reading of the clock. They are one call's steps (its
        gate and loop check, its record and note), so one moment, and no other thread's
        operation comes between them; an operation that raises leaves those before it done."""
        if type(self).run is not MemoryStore.run:
            # A subclass that overrides ``run`` (a store that counts or fails operations) has
            # always been handed each operation of a batch too: it still is.
            return [self.run(op) for op in ops]
        with self._lock:
            now = self.clock()
            return [_APPLY[type(op)](self, op, now) for op in ops]

    async def arun_many(self, ops: Sequence[Op[Any]]) -> list[Any]:
        return self.run_many(ops)

    # -- each operation applied to the core (the lock held, ``now`` read once) ------------------

    def _gate(self, op: Gate, now: float) -> VelocityVerdict:
        entry = self._live(op.key, now)
        if entry is None or entry.velocity is None:
            return VelocityVerdict(allowed=True)
        return _velocity.gate(entry.velocity, now)

    def _record(self, op: Record, now: float) -> VelocityVerdict:
        entry = self._entry(op.key, now)
        if entry.velocity is None:
            entry.velocity = _velocity.new_state(now)
        return _velocity.record(entry.velocity, op.amount, now, op.velocity)

    def _record_batch(self, op: RecordBatch, now: float) -> VelocityVerdict:
        entry = self._entry(op.key, now)
        if entry.velocity is None:
            entry.velocity = _velocity.new_state(now)
        first_trip = None
        for amount in op.amounts:
            verdict = _velocity.record(entry.velocity, amount, now, op.velocity)
            if verdict.tripped and first_trip is None:
                first_trip = verdict
        return first_trip or verdict

    def _admit(self, op: Admit, now: float) -> AdmitVerdict:
        entry = self._entry(op.key, now)
        if op.velocity is not None and entry.velocity is None and op.amount > 0:
            entry.velocity = _velocity.new_state(now)
        if op.bucket is not None:
            entry.bucket_policy = op.bucket
            if entry.bucket is None:
                entry.bucket = _bucket.new_state(now, op.bucket)
        return admit(
            entry.velocity,
            entry.bucket,
            cost=op.cost,
            amount=op.amount,
            now=now,
            velocity=op.velocity,
            bucket=op.bucket,
        )

    def _leased(self, op: Lease | ReturnLease, now: float) -> _Entry:
        """The key's entry with the states the lease operation works on (``_admit``'s)."""
        entry = self._entry(op.key, now)
        records = op.pending or (type(op) is Lease and op.amount > 0)
        if op.velocity is not None and entry.velocity is None and records:
            entry.velocity = _velocity.new_state(now)
        if op.bucket is not None:
            entry.bucket_policy = op.bucket
            if entry.bucket is None:
                entry.bucket = _bucket.new_state(now, op.bucket)
        return entry

    def _lease(self, op: Lease, now: float) -> LeaseVerdict:
        entry = self._leased(op, now)
        return grant(
            entry.velocity,
            entry.bucket,
            cost=op.cost,
            amount=op.amount,
            want=op.want,
            give_back=op.give_back,
            pending=op.pending,
            now=now,
            velocity=op.velocity,
            bucket=op.bucket,
        )

    def _return_lease(self, op: ReturnLease, now: float) -> VelocityVerdict | None:
        entry = self._leased(op, now)
        return settle(
            entry.velocity,
            entry.bucket,
            give_back=op.give_back,
            pending=op.pending,
            now=now,
            velocity=op.velocity,
            bucket=op.bucket,
        )

    def _peek(self, key: str, now: float) -> _Entry:
        """The key's entry, or an empty one; read only: neither touched nor moved."""
        entry = self._entries.get(key)
        return _Entry() if entry is None or entry.expires <= now else entry

    def _status(self, op: ReadStatus, now: float) -> Status:
        entry = self._peek(op.key, now)
        return status_of(op.key, entry.velocity, entry.bucket, now, op.velocity, op.bucket)

    def _read_state(self, op: ReadState, now: float) -> StoredState:
        return _snapshot(op.key, self._peek(op.key, now), now)

    def _list(self, op: ListKeys, now: float) -> KeyPage:
        # In key order, so that a page starts after the previous page's last key.
        keys = sorted(k for k in self._entries if k.startswith(op.key) and k > op.cursor)
        count = max(op.count, 1)
        statuses = []
        for key in keys[:count]:
            entry = self._entries[key]
            if entry.velocity is None and entry.bucket is None and entry.loops is not None:
                continue  # loop state only: RedisStore keeps it apart, unlisted, too
            if entry.expires > now:
                statuses.append(
                    status_of(key, entry.velocity, entry.bucket, now, op.velocity, op.bucket)
                )
        return KeyPage(statuses, keys[count - 1] if len(keys) > count else "")

    def _reset(self, op: Reset, now: float) -> None:
        entry = self._entries.get(op.key)
        if entry is not None and entry.velocity is not None:
            _velocity.reset(entry.velocity)
        if entry is not None and entry.bucket is not None:
            entry.bucket.tokens = _bucket.FULL

    def _forgive(self, op: Forgive, now: float) -> None:
        entry = self._live(op.key, now)
        if entry is not None and entry.velocity is not None:
            _velocity.forgive(entry.velocity)

    # -- run budgets: their own bounded table ---------------------------------------------------

    def _run(self, key: str, now: float) -> RunState | None:
        """The run's live state, marked most recently used; lock held."""
        state = _budget.live(self._runs.get(key), now)
        if state is None:
            self._runs.pop(key, None)
            return None
        self._runs.move_to_end(key)
        return state

    def _keep_run(self, key: str, state: RunState, now: float) -> None:
        self._runs[key] = state
        self._runs.move_to_end(key)
        if len(self._runs) <= self.max_runs:
            return
        probed = itertools.islice(self._runs.items(), EVICTION_PROBES + 1)
        oldest = [(k, run) for k, run in probed if k != key][:EVICTION_PROBES]
        victim = next(
            (k for k, run in oldest if run.expires <= now),
            next((k for k, run in oldest if run.reserved_tokens == run.reserved_usd == 0), None),
        )
        del self._runs[victim if victim is not None else oldest[0][0]]
        self.run_evictions += 1
        if victim is None:
            logger.warning(
                "tokenfuse MemoryStore evicted a run with calls in flight (%d runs); raise "
                "max_runs",
                len(self._runs),
            )

    def _open_run(self, op: OpenRun, now: float) -> RunVerdict:
        state = _budget.open_run(
            self._run(op.key, now), now, op.ttl, op.token_limit, op.usd_limit, op.join
        )
        self._keep_run(op.key, state, now)
        return RunVerdict(allowed=True, state=replace(state))

    def _reserve(self, op: Reserve, now: float) -> RunVerdict:
        state = self._run(op.key, now) or _budget.new_run(
            now, op.ttl, _budget.NO_LIMIT, _budget.NO_LIMIT
        )
        verdict = _budget.reserve(state, now, op.ttl, op.tokens, op.usd)
        self._keep_run(op.key, state, now)
        verdict.state = replace(state)
        return verdict

    def _settle(self, op: Settle, now: float) -> RunVerdict:
        state = self._run(op.key, now) or _budget.new_run(
            now, op.ttl, _budget.NO_LIMIT, _budget.NO_LIMIT
        )
        verdict = _budget.settle(state, now, op.ttl, op.held_tokens, op.held_usd, op.tokens, op.usd)
        self._keep_run(op.key, state, now)
        verdict.state = replace(state)
        return verdict

    def _read_run(self, op: ReadRun, now: float) -> RunState | None:
        state = _budget.live(self._runs.get(op.key), now)
        return replace(state) if state is not None else None

    def _configure(self, op: Configure, now: float) -> None:
        entry = self._entry(op.key, now)
        if not isinstance(op.limit, Unset):
            if entry.velocity is None:
                entry.velocity = _velocity.new_state(now)
            entry.velocity.limit_override = -1.0 if op.limit is None else op.limit
        if isinstance(op.capacity, Unset) and isinstance(op.rate, Unset):
            return
        if entry.bucket is None:
            entry.bucket = BucketState(tokens=_bucket.FULL, updated=now)
        if not isinstance(op.capacity, Unset):
            entry.bucket.capacity_override = -1.0 if op.capacity is None else op.capacity
        if not isinstance(op.rate, Unset):
            entry.bucket.rate_override = -1.0 if op.rate is None else op.rate

    def _check_loops(self, op: CheckLoops, now: float) -> LoopVerdict:
        if op.local:  # "is this call tripped?": nothing counted, no entry made
            entry = self._live(op.key, now)
            state = entry.loops if entry is not None else None
            if state is None:
                return LoopVerdict()
            return _loops.check(state, op.fingerprint, now, op.policy, count=False)
        entry = self._entry(op.key, now)
        if entry.loops is None:
            entry.loops = LoopState()
        return _loops.check(entry.loops, op.fingerprint, now, op.policy)

    def _note_loop(self, op: NoteLoop, now: float) -> LoopVerdict:
        entry = self._entry(op.key, now)
        if entry.loops is None:
            entry.loops = LoopState()
        # As the codec sends it to Redis; a success (most notes) has no error to clean.
        error = _loops.clean_error(op.error) if op.error else ""
        return _loops.note(
            entry.loops, op.fingerprint, op.failed, float(op.status), error, now, op.policy,
            op.send,
        )  # fmt: skip

    def _note_loop_batch(self, op: NoteLoopBatch, now: float) -> list[LoopVerdict]:
        return [self._note_loop(note, now) for note in op.notes]

    def _forget_loops(self, op: ForgetLoops, now: float) -> int:
        entry = self._entries.get(op.key)
        if entry is None or entry.loops is None:
            return 0
        before = len(entry.loops.calls)
        _loops.forget(entry.loops, op.fingerprint)
        return before - len(entry.loops.calls)

    def loop_state(self, key: str) -> LoopState | None:
        """A copy of the key's failure-loop state (tests and operators), read only."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.loops is None:
                return None
            return LoopState([replace(call) for call in entry.loops.calls])


#: How ``MemoryStore`` runs each operation.
_APPLY: dict[type[Op[Any]], Callable[[MemoryStore, Any, float], Any]] = {
    Gate: MemoryStore._gate,
    Record: MemoryStore._record,
    RecordBatch: MemoryStore._record_batch,
    Admit: MemoryStore._admit,
    Lease: MemoryStore._lease,
    ReturnLease: MemoryStore._return_lease,
    ReadStatus: MemoryStore._status,
    ListKeys: MemoryStore._list,
    Reset: MemoryStore._reset,
    Forgive: MemoryStore._forgive,
    Configure: MemoryStore._configure,
    ReadState: MemoryStore._read_state,
    CheckLoops: MemoryStore._check_loops,
    NoteLoop: MemoryStore._note_loop,
    NoteLoopBatch: MemoryStore._note_loop_batch,
    ForgetLoops: MemoryStore._forget_loops,
    OpenRun: MemoryStore._open_run,
    Reserve: MemoryStore._reserve,
    Settle: MemoryStore._settle,
    ReadRun: MemoryStore._read_run,
}


def _snapshot(key: str, entry: _Entry, now: float) -> StoredState:
    """A copy of the entry's states, safe to read after the lock is released."""
    velocity = entry.velocity
    if velocity is not None:
        velocity = replace(velocity, amounts=list(velocity.amounts), largest=list(velocity.largest))
    bucket = replace(entry.bucket) if entry.bucket is not None else None
    return StoredState(key, now, velocity, bucket)
