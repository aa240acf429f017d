"""The contract every store keeps: it runs operations (``ops``), sync and async.

A store runs one whole decision per call, atomically: a guarded call costs one store round
trip for its gate and one for its record (outbound), or one for its admission (inbound).
Stores raise ``StoreUnavailable`` for infrastructure trouble and nothing else; failing open is
the ``Fuse``'s job, so every store fails the same way.

A store that implements both faces but can serve only one (``RedisStore`` over an asyncio
client) says so with ``has_sync`` / ``has_async``; ``Fuse`` reads them once.

A store may also answer some operations without a round trip: ``known(op)`` returns the
result, or None (``RedisStore``: a local loop check, from its open-key view). ``Fuse`` reads
it once too, and asks it for an operation that would ride in a pipeline alone with another
(``admit_with``, ``gate_with``), which then goes as a plain call. ``known`` counts nothing
when it answers None: the operation is then sent, and the store's ``run_many`` answers (and
counts) it as it always does.
"""

from __future__ import annotations

from typing import Protocol, TypeVar, runtime_checkable

from .ops import Op

__all__ = ["AsyncStore", "Store", "SyncStore", "async_face", "sync_face"]

R = TypeVar("R")


@runtime_checkable
class SyncStore(Protocol):
    def run(self, op: Op[R]) -> R:
        """Run one operation on its key and return its result (``store.run(Gate(key))``)."""
        ...


@runtime_checkable
class AsyncStore(Protocol):
    async def arun(self, op: Op[R]) -> R:
        """``run`` for asyncio code."""
        ...


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
