"""The embedded default store: the policy core applied to a bounded in-process table."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .._core import bucket as _bucket
from .._core import velocity as _velocity
from .._core.admission import AdmitVerdict, admit
from .._core.bucket import BucketState
from .._core.status import Status, status_of
from .._core.velocity import VelocityState, VelocityVerdict
from .._errors import ConfigurationError
from .ops import Admit, Configure, Forgive, Gate, Op, ReadStatus, Record, Reset, Unset

__all__ = ["MemoryStore"]

R = TypeVar("R")


@dataclass(slots=True)
class _Entry:
    velocity: VelocityState | None = None
    bucket: BucketState | None = None
    expires: float = 0.0


class MemoryStore:
    """State in this process only: zero setup, thread-safe, bounded.

    At most ``max_keys`` identities are held; past that the least recently used is evicted, so
    a flood of distinct (possibly spoofed) identities costs a fixed amount of memory. Entries
    idle for ``ttl`` seconds expire lazily when touched or evicted; no background thread runs.

    >>> store = MemoryStore(max_keys=10_000)
    """

    def __init__(
        self,
        *,
        max_keys: int = 100_000,
        ttl: float = 14 * 86_400.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_keys < 1:
            raise ConfigurationError("max_keys must be at least 1")
        self.max_keys = max_keys
        self.ttl = float(ttl)
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

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
                self._entries.popitem(last=False)
        return entry

    def run(self, op: Op[R]) -> R:
        """Run one operation (``ops``): under the store's lock, at one reading of its clock."""
        apply = _APPLY[type(op)]
        with self._lock:
            result: R = apply(self, op, self.clock())
        return result

    async def arun(self, op: Op[R]) -> R:
        """``run``: nothing here waits on I/O, so the async face runs the same code directly."""
        return self.run(op)

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

    def _admit(self, op: Admit, now: float) -> AdmitVerdict:
        entry = self._entry(op.key, now)
        if op.velocity is not None and entry.velocity is None and op.amount > 0:
            entry.velocity = _velocity.new_state(now)
        if op.bucket is not None and entry.bucket is None:
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

    def _status(self, op: ReadStatus, now: float) -> Status:
        entry = self._entries.get(op.key)  # read only: neither touched nor moved
        if entry is None or entry.expires <= now:
            entry = _Entry()
        return status_of(op.key, entry.velocity, entry.bucket, now, op.velocity, op.bucket)

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


#: How ``MemoryStore`` runs each operation.
_APPLY: dict[type[Op[Any]], Callable[[MemoryStore, Any, float], Any]] = {
    Gate: MemoryStore._gate,
    Record: MemoryStore._record,
    Admit: MemoryStore._admit,
    ReadStatus: MemoryStore._status,
    Reset: MemoryStore._reset,
    Forgive: MemoryStore._forgive,
    Configure: MemoryStore._configure,
}
