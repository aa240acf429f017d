"""A decision's connection from a caller's plain ``redis.ConnectionPool``, as its
``get_connection`` and ``release`` hand it out and take it back, minus what no one reads.

Those two also check the process id twice, name the pool and record four metrics (no-ops
while they are off), read the clock, dispatch a "released" event (whose one default listener
re-authenticates a connection given a new token) and ask the socket for unread data with a
``recv`` between two ``settimeout`` calls. Here, in the process that made the pool, while
redis-py's metrics are off, no client-side cache is on and only that default listener
listens: an idle connection is taken off the pool's list under its lock and checked as
``get_connection`` checks it (``redis_ready.check_pooled``), and put back under the lock
unless it has a new token to authenticate or was asked to reconnect. Every other case (no
idle connection: a new one to make; a pool of another class) is redis-py's own.
"""

from __future__ import annotations

import os
from typing import Any

from .redis_budget import metrics_on, only_reauth_listens
from .redis_ready import check_pooled

__all__ = ["give_back", "take"]

try:  # redis-py 7.1 and later: metrics, a "released" event and re-authentication
    import redis.connection
    from redis.event import AfterConnectionReleasedEvent as _RELEASED
    from redis.event import ReAuthConnectionListener as _REAUTH

    _LEAN = all(
        hasattr(redis.connection.AbstractConnection, name)
        for name in ("should_reconnect", "can_read", "is_connected", "re_auth")
    )
except ImportError:  # pragma: no cover - depends on the redis-py installed
    _LEAN = False


def take(pool: Any) -> Any:
    """A connection of ``pool`` for one decision."""
    if _quick(pool):
        with pool._lock:
            available = pool._available_connections
            connection = available.pop() if available else None
            if connection is not None:
                pool._in_use_connections.add(connection)
        if connection is not None:
            try:  # (as get_connection: whatever stops the check gives the connection back)
                check_pooled(pool, connection)
            except BaseException:
                pool.release(connection)
                raise
            return connection
    return pool.get_connection()


def give_back(pool: Any, connection: Any) -> None:
    """``pool.release(connection)`` of a connection ``take`` handed out."""
    if (
        _quick(pool)
        and connection.pid == pool.pid
        and getattr(connection, "_re_auth_token", True) is None  # (no such: redis-py's way)
        and not connection.should_reconnect()
    ):
        with pool._lock:
            try:
                pool._in_use_connections.remove(connection)
            except KeyError:  # (as release: not this pool's, not taken back)
                return
            pool._available_connections.append(connection)
        return
    pool.release(connection)


def _quick(pool: Any) -> bool:
    """Whether taking or giving back a connection needs none of the pool's bookkeeping."""
    if not _LEAN or pool.cache is not None or pool.pid != os.getpid():
        return False
    return not metrics_on() and only_reauth_listens(pool, _RELEASED, _REAUTH)
