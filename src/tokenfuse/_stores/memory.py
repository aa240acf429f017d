"""The embedded default store: the policy core applied to a bounded in-process table."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from .._core import bucket as _bucket
from .._core import velocity as _velocity
from .._core.admission import AdmitVerdict, admit
from .._core.bucket import BucketPolicy, BucketState
from .._core.status import Status, status_of
from .._core.velocity import VelocityPolicy, VelocityState, VelocityVerdict
from .._errors import ConfigurationError
from .base import UNSET, Unset

__all__ = ["MemoryStore"]


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

    def _entry(self, key: str, now: float, *, create: bool) -> _Entry | None:
        """The live entry for ``key`` (marked most recently used); lock held by the caller."""
        entry = self._entries.get(key)
        if entry is not None and entry.expires <= now:
            del self._entries[key]
            entry = None
        if entry is None:
            if not create:
                return None
            entry = self._entries[key] = _Entry()
            if len(self._entries) > self.max_keys:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        entry.expires = now + self.ttl
        return entry

    # -- sync ---------------------------------------------------------------------------------

    def gate(self, key: str) -> VelocityVerdict:
        with self._lock:
            now = self.clock()
            entry = self._entry(key, now, create=False)
            if entry is None or entry.velocity is None:
                return VelocityVerdict(allowed=True)
            return _velocity.gate(entry.velocity, now)

    def record(self, key: str, amount: float, velocity: VelocityPolicy) -> VelocityVerdict:
        with self._lock:
            now = self.clock()
            entry = self._entry(key, now, create=True)
            assert entry is not None
            if entry.velocity is None:
                entry.velocity = _velocity.new_state(now)
            return _velocity.record(entry.velocity, amount, now, velocity)

    def admit(
        self,
        key: str,
        *,
        cost: float,
        amount: float,
        velocity: VelocityPolicy | None,
        bucket: BucketPolicy | None,
    ) -> AdmitVerdict:
        with self._lock:
            now = self.clock()
            entry = self._entry(key, now, create=True)
            assert entry is not None
            if velocity is not None and entry.velocity is None and amount > 0:
                entry.velocity = _velocity.new_state(now)
            if bucket is not None and entry.bucket is None:
                entry.bucket = _bucket.new_state(now, bucket)
            return admit(
                entry.velocity,
                entry.bucket,
                cost=cost,
                amount=amount,
                now=now,
                velocity=velocity,
                bucket=bucket,
            )

    def status(self, key: str, velocity: VelocityPolicy, bucket: BucketPolicy | None) -> Status:
        with self._lock:
            now = self.clock()
            entry = self._entries.get(key)
            if entry is None or entry.expires <= now:
                entry = _Entry()
            return status_of(key, entry.velocity, entry.bucket, now, velocity, bucket)

    def reset(self, key: str) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.velocity is not None:
                _velocity.reset(entry.velocity)
            if entry is not None and entry.bucket is not None:
                entry.bucket.tokens = _bucket.FULL

    def configure(
        self,
        key: str,
        *,
        limit: float | None | Unset = UNSET,
        capacity: float | None | Unset = UNSET,
        rate: float | None | Unset = UNSET,
    ) -> None:
        with self._lock:
            now = self.clock()
            entry = self._entry(key, now, create=True)
            assert entry is not None
            if not isinstance(limit, Unset):
                if entry.velocity is None:
                    entry.velocity = _velocity.new_state(now)
                entry.velocity.limit_override = -1.0 if limit is None else limit
            if not (isinstance(capacity, Unset) and isinstance(rate, Unset)):
                if entry.bucket is None:
                    entry.bucket = BucketState(tokens=_bucket.FULL, updated=now)
                if not isinstance(capacity, Unset):
                    entry.bucket.capacity_override = -1.0 if capacity is None else capacity
                if not isinstance(rate, Unset):
                    entry.bucket.rate_override = -1.0 if rate is None else rate

    # -- async: nothing here waits on I/O, so the async face runs the same code directly -------

    async def agate(self, key: str) -> VelocityVerdict:
        return self.gate(key)

    async def arecord(self, key: str, amount: float, velocity: VelocityPolicy) -> VelocityVerdict:
        return self.record(key, amount, velocity)

    async def aadmit(
        self,
        key: str,
        *,
        cost: float,
        amount: float,
        velocity: VelocityPolicy | None,
        bucket: BucketPolicy | None,
    ) -> AdmitVerdict:
        return self.admit(key, cost=cost, amount=amount, velocity=velocity, bucket=bucket)

    async def astatus(
        self, key: str, velocity: VelocityPolicy, bucket: BucketPolicy | None
    ) -> Status:
        return self.status(key, velocity, bucket)

    async def areset(self, key: str) -> None:
        self.reset(key)

    async def aconfigure(
        self,
        key: str,
        *,
        limit: float | None | Unset = UNSET,
        capacity: float | None | Unset = UNSET,
        rate: float | None | Unset = UNSET,
    ) -> None:
        self.configure(key, limit=limit, capacity=capacity, rate=rate)
