"""The contract every store keeps, sync and async.

A store runs one whole decision per call, atomically: a guarded call costs one store round
trip for its gate and one for its record (outbound), or one for its admission (inbound).
Stores raise ``StoreUnavailable`` for infrastructure trouble and nothing else; failing open is
the ``Fuse``'s job, so every store fails the same way.

``key`` arguments are already storage-safe (``Fuse`` hashes identities and adds its name).

A store that implements both faces but can serve only one (``RedisStore`` over an asyncio
client) says so with ``has_sync`` / ``has_async``; ``Fuse`` reads them once.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from .._core.admission import AdmitVerdict
from .._core.bucket import BucketPolicy
from .._core.status import Status
from .._core.velocity import VelocityPolicy, VelocityVerdict

__all__ = [
    "UNSET",
    "AdmitVerdict",
    "AsyncStore",
    "Store",
    "SyncStore",
    "Unset",
    "async_face",
    "sync_face",
]


class Unset:
    """Marker for 'leave this setting as it is' in ``configure``."""

    _instance: Unset | None = None

    def __new__(cls) -> Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"


UNSET = Unset()


@runtime_checkable
class SyncStore(Protocol):
    def gate(self, key: str) -> VelocityVerdict: ...

    def record(self, key: str, amount: float, velocity: VelocityPolicy) -> VelocityVerdict: ...

    def admit(
        self,
        key: str,
        *,
        cost: float,
        amount: float,
        velocity: VelocityPolicy | None,
        bucket: BucketPolicy | None,
    ) -> AdmitVerdict: ...

    def status(self, key: str, velocity: VelocityPolicy, bucket: BucketPolicy | None) -> Status: ...

    def reset(self, key: str) -> None: ...

    def configure(
        self,
        key: str,
        *,
        limit: float | None | Unset = UNSET,
        capacity: float | None | Unset = UNSET,
        rate: float | None | Unset = UNSET,
    ) -> None: ...


@runtime_checkable
class AsyncStore(Protocol):
    async def agate(self, key: str) -> VelocityVerdict: ...

    async def arecord(
        self, key: str, amount: float, velocity: VelocityPolicy
    ) -> VelocityVerdict: ...

    async def aadmit(
        self,
        key: str,
        *,
        cost: float,
        amount: float,
        velocity: VelocityPolicy | None,
        bucket: BucketPolicy | None,
    ) -> AdmitVerdict: ...

    async def astatus(
        self, key: str, velocity: VelocityPolicy, bucket: BucketPolicy | None
    ) -> Status: ...

    async def areset(self, key: str) -> None: ...

    async def aconfigure(
        self,
        key: str,
        *,
        limit: float | None | Unset = UNSET,
        capacity: float | None | Unset = UNSET,
        rate: float | None | Unset = UNSET,
    ) -> None: ...


class Store(SyncStore, AsyncStore, Protocol):
    """A store usable from both sync and async code (``MemoryStore``, ``RedisStore`` from URL)."""


def sync_face(store: object) -> SyncStore | None:
    """The store as a sync store, or None when it cannot serve sync calls."""
    if isinstance(store, SyncStore) and getattr(store, "has_sync", True):
        return store
    return None


def async_face(store: object) -> AsyncStore | None:
    """The store as an async store, or None when it cannot serve async calls."""
    if isinstance(store, AsyncStore) and getattr(store, "has_async", True):
        return store
    return None
