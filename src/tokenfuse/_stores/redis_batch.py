"""Several commands in one round trip, on one pooled connection: what ``RedisStore.run_many``
and ``arun_many`` send (the middleware's admission and failure-loop check, a transport's gate
and run-budget reservations).

redis-py's ``Pipeline`` does this too, but a pipeline object is made, filled, executed and
reset for every batch: sending the middleware's two scripts this way instead took
``arun_many`` of them from 879k to 740k instructions ("Middleware" in the README). Here the
commands are packed and written at once and their replies read in order, on a connection
taken from the client's own pool, with the connection's own retry (one at once on a
connection error, as every command of the store's clients has: ``redis_budget``) and its own
timeouts (the write: ``redis_send``, ``redis_send_sync``). A reply that is an
error (``NOSCRIPT``, a script's error) is returned in its place, as the pipeline's
``raise_on_error=False`` does; any other failure disconnects the connection (redis-py does
that in its reads and writes, cancellation included), so no reply is left unread on a
connection that goes back to the pool.

A cluster client (commands routed to each key's node) and a client on a single connection
(``single_connection_client``, shared under its lock) keep redis-py's pipeline. Either way
the replies are read undecoded, as a single script call's are (``redis_direct``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

import redis
import redis.asyncio
from redis.exceptions import ResponseError

from . import redis_plain_pool
from .redis_budget import AsyncBlockingPool, SyncBlockingPool
from .redis_send import send_packed
from .redis_send_sync import send_packed_sync

__all__ = ["Command", "asend_all", "on_pooled_connection", "on_pooled_connection_async", "send_all"]

T = TypeVar("T")

#: One command: its name and arguments (``("FCALL", function, 1, key, *args)``).
Command = Sequence[Any]


def send_all(client: Any, commands: Sequence[Command]) -> list[Any]:
    """The replies of ``commands``, sent in one round trip; error replies in their places."""
    if type(client) is not redis.Redis or client.connection is not None:
        return _pipelined(client, commands)
    return on_pooled_connection(client, lambda connection: _exchange(connection, commands))


async def asend_all(client: Any, commands: Sequence[Command]) -> list[Any]:
    """``send_all`` for an asyncio client."""
    # (its one connection is made at its first command: ask the option, not the connection)
    if type(client) is not redis.asyncio.Redis or client.single_connection_client:
        return await _apipelined(client, commands)
    return await on_pooled_connection_async(
        client, lambda connection: _aexchange(connection, commands)
    )


def on_pooled_connection(client: Any, exchange: Callable[[Any], T]) -> T:
    """``exchange(connection)`` on a connection of ``client``'s own pool (a plain client's),
    under the connection's retry: a connection error disconnects it before the retry, which
    reconnects; the connection goes back to the pool whatever happened."""
    pool: Any = client.connection_pool  # redis-py's own pool, typed loosely there
    kind = type(pool)
    if kind is SyncBlockingPool:  # RedisStore.from_url's: its lean way (redis_budget)
        take, give_back = pool.take, pool.give_back
    elif kind is redis.ConnectionPool:  # a caller's plain pool: the same (redis_plain_pool)
        take = partial(redis_plain_pool.take, pool)
        give_back = partial(redis_plain_pool.give_back, pool)
    else:
        take, give_back = pool.get_connection, pool.release
    connection = take()
    try:
        return connection.retry.call_with_retry(  # type: ignore[no-any-return]
            lambda: exchange(connection), lambda error: connection.disconnect()
        )
    finally:
        give_back(connection)


async def on_pooled_connection_async(client: Any, exchange: Callable[[Any], Awaitable[T]]) -> T:
    """``on_pooled_connection`` for an asyncio client."""
    pool: Any = client.connection_pool
    if type(pool) is AsyncBlockingPool:  # RedisStore.from_url's: its lean way (redis_budget)
        take, give_back = pool.take, pool.give_back
    else:
        take, give_back = pool.get_connection, pool.release
    connection = await take()
    try:
        return await connection.retry.call_with_retry(  # type: ignore[no-any-return]
            lambda: exchange(connection), lambda error: connection.disconnect()
        )
    finally:
        await give_back(connection)


def _exchange(connection: Any, commands: Sequence[Command]) -> list[Any]:
    send_packed_sync(connection, connection.pack_commands(commands))
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(connection.read_response(disable_decoding=True))
        except ResponseError as exc:
            replies.append(exc)
    return replies


async def _aexchange(connection: Any, commands: Sequence[Command]) -> list[Any]:
    await send_packed(connection, connection.pack_commands(commands))
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(await connection.read_response(disable_decoding=True))
        except ResponseError as exc:
            replies.append(exc)
    return replies


def _pipelined(client: Any, commands: Sequence[Command]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for command in commands:
        # execute_command, not evalsha(): redis-py's cluster pipelines refuse the method
        # (not the command), and route EVALSHA and FCALL by their key like any other
        # (FCALL's key: redis_clients.learn_fcall_keys).
        pipe.execute_command(*command, NEVER_DECODE=True)
    return pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]


async def _apipelined(client: Any, commands: Sequence[Command]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command, NEVER_DECODE=True)
    return await pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]
