"""A decision's FCALL (or EVALSHA) sent straight on a pooled connection, on plain clients.

redis-py's ``execute_command`` wraps every command in work a decision does not use: its
metrics recorder (called whether metrics are on or not), a closure per call, a check for
HIMPORT's arguments, the response-callback lookup. For a plain ``redis.Redis`` or
``redis.asyncio.Redis`` (its own pool: no cluster, no single-connection client) a script
call here does what ``execute_command`` does with the same redis-py pieces, on a pooled
connection as a batch of commands is sent (``redis_batch.on_pooled_connection``):

* a connection from the client's pool, which waits for one or raises when the pool stays
  exhausted (``StoreBusy``, as through ``execute_command``);
* the command sent and its reply read under the connection's own ``Retry``: a connection
  error disconnects the connection before the retry (which reconnects), and the last error
  is raised to the store's ``REDIS_ERRORS`` boundary; an error reply (NOSCRIPT) is raised
  and leaves the connection usable;
* the connection released to the pool whatever happened (the pool drops one a server asked
  to reconnect);
* the command packed once, in half the time of redis-py's packer (``redis_send.pack``), and
  written as redis-py writes it, under its timeout and with its errors, but without the Task
  redis-py's asyncio write makes per command (``redis_send``) or the sync write's own checks
  (``redis_send_sync``); a connection due its health check is sent redis-py's way (a PING).

Replies are read undecoded on either path (``disable_decoding``, or redis-py's
``NEVER_DECODE`` option of ``execute_command``): the decisions' verdicts are packed doubles,
which a client built with ``decode_responses=True`` would otherwise try to read as UTF-8.

Any other client goes through ``execute_command``, and so does every call while something
watches redis-py's commands: its own metrics turned on, or an ``execute_command`` that
tracing instrumentation wrapped. So does every client of a redis-py without metrics
(``redis.observability``): older ones, whose ``execute_command`` this path does not mirror.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import redis
import redis.asyncio

from .redis_batch import on_pooled_connection, on_pooled_connection_async
from .redis_send import pack, send_packed
from .redis_send_sync import send_packed_sync

try:
    from redis.observability.providers import get_observability_instance
except ImportError:  # pragma: no cover - depends on the redis-py installed
    get_observability_instance = None  # type: ignore[assignment]

__all__ = ["async_sender", "sync_sender"]

#: A command's words (``("FCALL", function, 1, key, *args)``) -> its reply.
SyncSend = Callable[[tuple[Any, ...]], Any]
AsyncSend = Callable[[tuple[Any, ...]], Awaitable[Any]]


def sync_sender(client: Any) -> SyncSend:
    """How ``client`` sends a script call: on its pool directly when it is plain."""
    if not _plain(client, redis.Redis):
        return functools.partial(_through_client, client)
    return functools.partial(_send, client)


def async_sender(client: Any) -> AsyncSend:
    """``sync_sender`` for an asyncio client."""
    if not _plain(client, redis.asyncio.Redis):
        return functools.partial(_athrough_client, client)
    return functools.partial(_asend, client)


def _plain(client: Any, kind: type[Any]) -> bool:
    """Whether ``client`` is redis-py's own client class on a pool of connections: not a
    subclass (which may send commands its own way), a cluster client nor a single-connection
    client."""
    if type(client) is not kind or get_observability_instance is None:
        return False
    return client.connection is None and not getattr(client, "single_connection_client", False)


def _watched(client: Any) -> bool:
    """Whether this command must go through ``execute_command`` for someone to see it:
    redis-py's metrics are on (checked per call: they can be turned on at any time), or
    its ``execute_command`` is wrapped (OpenTelemetry's and other instrumentations wrap the
    class's method, or the client's)."""
    if get_observability_instance().is_enabled():
        return True
    method = type(client).execute_command
    return hasattr(method, "__wrapped__") or "execute_command" in vars(client)


def _through_client(client: Any, command: tuple[Any, ...]) -> Any:
    return client.execute_command(*command, NEVER_DECODE=True)


async def _athrough_client(client: Any, command: tuple[Any, ...]) -> Any:
    return await client.execute_command(*command, NEVER_DECODE=True)


def _send(client: Any, command: tuple[Any, ...]) -> Any:
    if _watched(client):
        return _through_client(client, command)
    return on_pooled_connection(client, functools.partial(_exchange, command=command))


def _exchange(connection: Any, command: tuple[Any, ...]) -> Any:
    send_packed_sync(connection, pack(connection, command))
    return connection.read_response(disable_decoding=True)


async def _asend(client: Any, command: tuple[Any, ...]) -> Any:
    if _watched(client):
        return await _athrough_client(client, command)
    return await on_pooled_connection_async(client, functools.partial(_aexchange, command=command))


async def _aexchange(connection: Any, command: tuple[Any, ...]) -> Any:
    await send_packed(connection, pack(connection, command))
    return await connection.read_response(disable_decoding=True)
