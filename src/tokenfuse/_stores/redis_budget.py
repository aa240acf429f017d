"""How long one decision may wait on Redis, and the client settings that hold it to that.

A guard must not hold up the call it guards for long, nor give up on a healthy store because
its own process is busy. A decision waits at most::

    POOL_WAIT        2 s     for a pooled connection while every one is busy: back-pressure
                             from this process's own load, so it waits rather than fail open
    CONNECT_TIMEOUT  1 s     to open a connection, when the pool needs a new one: a host that
                             does not answer the TCP handshake
    COMMAND_TIMEOUT  0.25 s  for the script's answer (the connection's handshake included):
                             the script runs in microseconds, so this much silence is a dead,
                             stopped or blackholed server
    ---------------  ------
    DECISION_BUDGET  3.25 s  the sum, which no single failure reaches: a blackholed server
                             costs a decision 0.25 s, an unreachable host 1 s

then the decision fails open (or closed with ``Fuse(fail_closed=True)``) and the fuse's
``StoreHealth`` takes over. Timeouts are not retried (a retry would double the wait); a
connection error is retried once, at once, so a pooled connection that a restarted server
closed costs one reconnect rather than a failed decision.

The two waits that only our own load can stretch are the generous ones. An asyncio client
measures its timeouts on the event loop, and a loop busy with a burst of requests runs late:
on a 2-core machine at load 10, a burst of 400 requests on one uvicorn worker kept some
decisions 1-2 s in the pool wait and some TCP connects over 0.25 s, which with tighter
values failed 35-180 of the 400 open.

**Pool.** ``RedisStore.from_url`` gives each client (sync and asyncio) a *blocking* pool of
``POOL_SIZE`` (50) connections. A decision holds a connection for one round trip (0.2-0.5 ms
on a LAN), so 50 connections carry far more decisions per second than one Python process can
make, and a burst larger than the pool waits its turn instead of failing. Fifty per client
keeps a fleet well inside Redis's default ``maxclients`` of 10,000 (100 processes with both
faces open use 10,000 only if every one of them is saturated at once). A decision that finds
no connection within ``POOL_WAIT`` counts as ``pool_exhausted``: back-pressure inside this
process, never an outage, never a reason to back off from a healthy server.

redis-py's blocking pools report an expired wait as a plain ``ConnectionError``, the same
type as a dead server, which would also make a cluster client drop its slot map; the pools
built here raise redis-py's own ``MaxConnectionsError`` instead ("the pool is full, the node
is fine"). redis-py's asyncio cluster client has no blocking pool at all (a node's pool
raises ``MaxConnectionsError`` at once), so a store built on one lets at most ``POOL_SIZE``
decisions run at a time and makes the rest wait up to ``POOL_WAIT`` for a turn.

A client the caller built is never changed (it is theirs, maybe shared with other work);
``client_advice`` says what in it breaks the budget, and the store logs that once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.connection
import redis.asyncio.retry
import redis.cluster
import redis.connection
import redis.retry
from redis.backoff import NoBackoff
from redis.exceptions import MaxConnectionsError

from .redis_ready import check_pooled

__all__ = [
    "COMMAND_TIMEOUT",
    "CONNECT_TIMEOUT",
    "DECISION_BUDGET",
    "POOL_SIZE",
    "POOL_WAIT",
    "AsyncBlockingPool",
    "SyncBlockingPool",
    "TurnTaking",
    "client_advice",
    "command_timeout",
    "metrics_on",
    "only_reauth_listens",
    "pool_exhausted",
    "url_options",
]

POOL_WAIT = 2.0
CONNECT_TIMEOUT = 1.0
COMMAND_TIMEOUT = 0.25
DECISION_BUDGET = POOL_WAIT + CONNECT_TIMEOUT + COMMAND_TIMEOUT
POOL_SIZE = 50


def url_options(*, asyncio_client: bool) -> dict[str, Any]:
    """The connection settings ``from_url`` gives the clients it builds (the caller's own
    options win)."""
    retry_class = redis.asyncio.retry.Retry if asyncio_client else redis.retry.Retry
    return {
        "socket_timeout": COMMAND_TIMEOUT,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "health_check_interval": 30,
        "max_connections": POOL_SIZE,
        "retry": retry_class(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
    }


def pool_exhausted(exc: BaseException) -> bool:
    """Whether a redis-py error means "no free connection in time" rather than "no server".

    Recognizes the pools built here and in redis-py's cluster clients (``MaxConnectionsError``)
    and a caller's own blocking pool, whose expired wait is a ``ConnectionError`` raised while
    handling the wait's ``queue.Empty`` (sync) or ``TimeoutError`` (asyncio).
    """
    if isinstance(exc, MaxConnectionsError):
        return True
    if isinstance(exc, redis.ConnectionError):
        wait = exc.__cause__ or exc.__context__
        return isinstance(wait, (queue.Empty, asyncio.TimeoutError))
    return False


def _full(pool: Any) -> MaxConnectionsError:
    return MaxConnectionsError(
        f"no free connection among {pool.max_connections} within {pool.timeout} s"
    )


class SyncBlockingPool(redis.BlockingConnectionPool):
    """redis-py's blocking pool, raising ``MaxConnectionsError`` when the wait runs out."""

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        except redis.ConnectionError as exc:
            if pool_exhausted(exc):
                raise _full(self) from exc
            raise

    def take(self) -> Any:
        """A connection for one decision (``redis_batch.on_pooled_connection``): while nothing
        needs the pool's bookkeeping, an idle connection taken off its queue without waiting.

        redis-py's ``get_connection`` and ``release`` also go through a deprecation wrapper,
        check the process id twice, take the queue under a timeout, name the pool and record
        six metrics (no-ops while they are off) and read the clock. Here, in the
        process that made the pool, while redis-py's metrics are off and no cache or
        maintenance (a node moving) needs the pool's lock, an idle connection is taken off the
        queue and checked as ``get_connection`` checks it (``check_pooled``); every other case (no
        idle connection: a new one to make, or a wait) goes through ``get_connection``."""
        if self._quick():
            try:
                connection = self.pool.get_nowait()
            except queue.Empty:
                connection = None  # every connection in use: get_connection waits for one
            else:
                if connection is None:  # room for a new one: get_connection makes it
                    self.pool.put_nowait(None)
            if connection is not None:
                try:  # (as get_connection: whatever stops the check gives the connection back)
                    check_pooled(self, connection)
                except BaseException:
                    self.release(connection)  # type: ignore[no-untyped-call]
                    raise
                return connection
        return self.get_connection()

    def give_back(self, connection: Any) -> None:
        """``release`` of a connection ``take`` handed out: put back on the queue while nothing
        needs more (a reconnect asked, a connection of another process)."""
        if self._quick() and connection.pid == self.pid and not connection.should_reconnect():
            with contextlib.suppress(queue.Full):  # (as release: a reset pool has its own)
                self.pool.put_nowait(connection)
            return
        self.release(connection)  # type: ignore[no-untyped-call]

    def _quick(self) -> bool:
        """Whether taking or giving back a connection needs none of the pool's bookkeeping."""
        if not _SYNC_LEAN or self._in_maintenance or self.cache is not None:
            return False
        if self.pid != os.getpid():  # a forked child: get_connection resets the pool first
            return False
        return not metrics_on()


class AsyncBlockingPool(redis.asyncio.BlockingConnectionPool):
    """The asyncio twin of ``SyncBlockingPool``, which waits only when it has to.

    redis-py's asyncio blocking pool takes every connection under an ``asyncio.Condition``
    and a timeout, even when one is free: 14 µs more than its plain pool per command on the
    benchmarks' machine, an eighth of a ``PING`` (``benchmarks/bench_middleware.py``'s
    ``RedisStore.arun(Admit)`` pays it on every decision). So while a connection, or room for
    one, is free and no call is waiting, a call takes it the plain pool's way; the blocking
    way only when it may have to wait. A connection is then released the blocking way (which
    wakes a waiter) whenever a call is waiting, so the waiters are served in their turn.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting = 0  # calls on the blocking way: each may be waiting for a connection

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if not self._someone_waits() and self.can_get_connection() and not self._maintained():
            try:
                return await _PLAIN_POOL.get_connection(self)  # type: ignore[no-untyped-call]
            except MaxConnectionsError:
                pass  # the last one was taken while this call waited for the pool's lock
        self._waiting += 1
        try:
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        except redis.ConnectionError as exc:
            if pool_exhausted(exc):
                raise _full(self) from exc
            raise
        finally:
            self._waiting -= 1

    async def release(self, connection: Any) -> None:
        if self._someone_waits():
            await super().release(connection)  # under the condition, waking a waiter
            return
        await _PLAIN_POOL.release(self, connection)
        if self._someone_waits():  # a call began to wait while the pool's lock was awaited
            async with self._condition:
                self._condition.notify()

    async def take(self) -> Any:
        """A connection for one decision (``redis_batch.on_pooled_connection_async``): while
        nothing else needs the pool's bookkeeping, an idle connection taken off the list.

        redis-py's ``get_connection`` and ``release`` also take the pool's lock, record the
        connection counts for its metrics (no-ops while they are off), dispatch a "released"
        event (whose one default listener re-authenticates a connection given a new token)
        and check the connection through its retry: some 20 µs per decision on the
        benchmarks' machine, a seventh of a ``PING``. Here, when no call waits, the lock is
        free, redis-py's metrics are off and only that default listener listens, a connection
        still connected with nothing unread is taken as it is; any other goes through redis-py's
        check (which reconnects it), and every other case through ``get_connection``."""
        available = self._available_connections
        if available and self._quick():
            connection = available.pop()
            self._in_use_connections.add(connection)
            try:  # (as get_connection: whatever stops the check gives the connection back)
                try:
                    ready = connection.is_connected and not await connection.can_read()
                except (redis.ConnectionError, redis.TimeoutError, OSError):
                    ready = False  # redis-py's check below reconnects it
                if not ready:
                    await self.ensure_connection(connection)
            except BaseException:
                await self.release(connection)
                raise
            return connection
        return await self.get_connection()

    async def give_back(self, connection: Any) -> None:
        """``release`` of a connection ``take`` handed out: put back on the list while nothing
        needs more (no waiter, no new token to authenticate, no reconnect asked)."""
        if (
            self._quick()
            and getattr(connection, "_re_auth_token", True) is None  # (no such: redis-py's way)
            and not connection.should_reconnect()
        ):
            self._in_use_connections.remove(connection)
            self._available_connections.append(connection)
            return
        await self.release(connection)

    def _quick(self) -> bool:
        """Whether taking or giving back a connection needs none of the pool's bookkeeping."""
        if self._waiting or self._lock.locked() or self._maintained() or not _LEAN:
            return False
        return not metrics_on() and only_reauth_listens(self, _RELEASED, _REAUTH)

    def _someone_waits(self) -> bool:
        return self._waiting > 0

    def _maintained(self) -> bool:
        """Whether redis-py's maintenance mode (a node moving) serializes the pool: then
        every call takes the blocking way, as redis-py's own pool would."""
        return bool(getattr(self, "_in_maintenance", False))


_PLAIN_POOL = redis.asyncio.ConnectionPool


def only_reauth_listens(pool: Any, released: type, reauth: type) -> bool:
    """Whether the only listener of ``pool``'s ``released`` connections is redis-py's own
    ``reauth``, which re-authenticates a connection given a new token (the lean ``give_back``
    sends that one through ``release``): nothing else needs the event dispatched."""
    dispatcher: Any = pool._event_dispatcher
    listeners = getattr(dispatcher, "_event_listeners_mapping", {}).get(released, [None])
    if len(listeners) == 1:  # the usual one (redis-py's own), asked with no generator made:
        return type(listeners[0]) is reauth  # this is asked twice a decision
    return all(type(listener) is reauth for listener in listeners)


def _metrics_off() -> bool:
    return False


try:  # redis-py 7.1 and later: metrics, a "released" event and re-authentication
    from redis.event import AsyncAfterConnectionReleasedEvent as _RELEASED
    from redis.event import AsyncReAuthConnectionListener as _REAUTH
    from redis.observability.providers import get_observability_instance

    def metrics_on() -> bool:
        """Whether redis-py records its metrics (then its pools' bookkeeping is read)."""
        return bool(get_observability_instance().is_enabled())

    _LEAN = all(
        hasattr(redis.asyncio.connection.AbstractConnection, name)
        for name in ("should_reconnect", "can_read", "is_connected", "re_auth")
    )
    _SYNC_LEAN = all(
        hasattr(redis.connection.AbstractConnection, name)
        for name in ("should_reconnect", "can_read", "is_connected", "disconnect")
    ) and all(
        hasattr(redis.BlockingConnectionPool, name)
        for name in ("maint_notifications_enabled", "_checkpid")
    )
except ImportError:  # pragma: no cover - depends on the redis-py installed
    metrics_on = _metrics_off
    _LEAN = False
    _SYNC_LEAN = False


class TurnTaking:
    """At most ``size`` calls in flight; the others wait up to ``wait`` seconds for a turn.

    The blocking pool that redis-py's asyncio cluster client lacks, put in front of it: with
    at most ``size`` decisions in flight no node's pool (of ``size``) can run out.
    """

    def __init__(self, size: int = POOL_SIZE, wait: float = POOL_WAIT) -> None:
        self.size = size
        self.wait = wait
        self._turns = asyncio.Semaphore(size)

    @classmethod
    def for_client(cls, client: redis.asyncio.cluster.RedisCluster) -> TurnTaking:
        """Turns for as many decisions as each of the client's node pools has connections."""
        size = client.get_connection_kwargs().get("max_connections")
        return cls(size if isinstance(size, int) and size > 0 else POOL_SIZE)

    def __call__(
        self, script: Callable[..., Awaitable[Any]]
    ) -> Callable[[Sequence[str], Sequence[str | bytes]], Awaitable[Any]]:
        async def in_turn(keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
            try:
                if self._turns.locked():  # no turn free, or others wait for one: in line
                    await asyncio.wait_for(self._turns.acquire(), self.wait)
                else:  # a free turn, taken at once: no timer to set and cancel
                    await self._turns.acquire()
            except asyncio.TimeoutError:
                raise MaxConnectionsError(
                    f"no turn among {self.size} decisions in flight within {self.wait} s"
                ) from None
            try:
                return await script(keys, args)
            finally:
                self._turns.release()

        return in_turn


def _effective(client: Any) -> tuple[object, object, int]:
    """(socket_timeout, socket_connect_timeout, retries) as the client's connections see them:
    an option left out means the connection class's default, not None."""
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        options = client.get_connection_kwargs()  # the cluster spells every option out
        timeouts = options.get("socket_timeout"), options.get("socket_connect_timeout")
        return (*timeouts, client.retry.get_retries())
    cluster = isinstance(client, redis.cluster.RedisCluster)
    node = client.get_default_node().redis_connection if cluster else client
    pool = node.connection_pool
    # Built only to read its settings: a connection opens no socket until it is used.
    connection = pool.connection_class(**pool.connection_kwargs)
    retry = client.retry if cluster else connection.retry  # a cluster retries at its level
    return connection.socket_timeout, connection.socket_connect_timeout, retry.get_retries()


def command_timeout(client: Any) -> float | None:
    """How long the client waits for an answer (None: for ever): a blocking command (XREAD
    BLOCK) must return well within it."""
    timeout = _effective(client)[0]
    return float(timeout) if isinstance(timeout, (int, float)) else None


def _too_long(value: object, limit: float) -> bool:
    return not isinstance(value, (int, float)) or value > limit


def _wait(value: object) -> str:
    return "for ever" if value is None else f"{value} s"


def client_advice(client: Any) -> list[str]:
    """What in a caller's client can make a decision wait longer than ``DECISION_BUDGET``,
    or fail open under a burst; each entry names the setting to change.

    >>> client_advice(redis.Redis())[0]
    'socket_timeout=5 lets a dead or blackholed server hold each decision 5 s; use 0.25'
    """
    timeout, connect_timeout, retries = _effective(client)
    advice = []
    limits = {"socket_timeout": (timeout, COMMAND_TIMEOUT),
              "socket_connect_timeout": (connect_timeout, CONNECT_TIMEOUT)}  # fmt: skip
    for name, (value, limit) in limits.items():
        if _too_long(value, limit):
            advice.append(
                f"{name}={value!r} lets a dead or blackholed server hold each decision "
                f"{_wait(value)}; use {limit}"
            )
    if retries > 1:
        advice.append(
            f"{retries} retries repeat that wait; use "
            "retry=Retry(NoBackoff(), 1, supported_errors=(ConnectionError,))"
        )
    advice.extend(_pool_advice(client))
    return advice


def _pool_advice(client: Any) -> list[str]:
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        return []  # no blocking pool exists for it: the store takes turns (TurnTaking)
    if isinstance(client, redis.cluster.RedisCluster):
        pool_class = client.nodes_manager.connection_pool_class
        factory = getattr(pool_class, "func", pool_class)  # a functools.partial, maybe
        blocking = isinstance(factory, type) and issubclass(factory, redis.BlockingConnectionPool)
        wait = getattr(pool_class, "keywords", {}).get("timeout", 20 if blocking else None)
        use = f"connection_pool_class=partial(BlockingConnectionPool, timeout={POOL_WAIT})"
    else:
        pool = client.connection_pool
        blocking = isinstance(pool, (redis.BlockingConnectionPool,
                                     redis.asyncio.BlockingConnectionPool))  # fmt: skip
        wait = getattr(pool, "timeout", None)
        use = (
            f"connection_pool=BlockingConnectionPool(max_connections={POOL_SIZE}, "
            f"timeout={POOL_WAIT})"
        )
    if not blocking:
        return [f"a non-blocking pool fails decisions at once under a burst; use {use}"]
    if _too_long(wait, POOL_WAIT):
        return [f"a pool wait of {_wait(wait)} holds decisions under a burst; use {use}"]
    return []
