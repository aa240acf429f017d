"""Where the fuses keep each key's state: in this process, or in Redis for every process.

::

    from tokenfuse import Fuse
    from tokenfuse.stores import RedisStore, StoreHealth

    fuse = Fuse(
        RedisStore.from_url("redis://localhost:6379/0"),
        health=StoreHealth(threshold=5, backoff_max=10.0),   # how a dead store is skipped
    )

``MemoryStore`` is the default. ``RedisStore`` needs the ``redis`` extra and is imported only
when first used. ``SyncStore`` and ``AsyncStore`` are the contract a store keeps, for type
annotations. docs/design.md ("State layout") describes what each store keeps;
docs/operations.md what a ``RedisStore`` does when Redis is slow, full or gone, and how
``StoreHealth.counts`` (a ``HealthCounts``) and ``StoreBusy`` show it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._errors import StoreBusy
from ._health import HealthCounts, StoreHealth
from ._stores.base import AsyncStore, SyncStore
from ._stores.memory import MemoryStore

if TYPE_CHECKING:
    from typing import Any

    from ._stores.redis import RedisStore

__all__ = [
    "AsyncStore",
    "HealthCounts",
    "MemoryStore",
    "RedisStore",
    "StoreBusy",
    "StoreHealth",
    "SyncStore",
]


def __getattr__(name: str) -> Any:
    # RedisStore needs the optional redis package: import it only when asked for.
    if name == "RedisStore":
        from ._stores.redis import RedisStore

        return RedisStore
    raise AttributeError(f"module 'tokenfuse.stores' has no attribute {name!r}")
