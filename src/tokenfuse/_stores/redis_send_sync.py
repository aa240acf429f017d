"""A command written on a pooled sync connection as redis-py writes it, minus its detours.

redis-py's sync ``send_command`` packs the words with its own packer (a pass over every word
with its checks, about as long again as ``redis_send.pack``), then ``send_packed_command``
checks the socket, the health check's due time, the command's type, and writes each part with
``sendall``. Here, on a connection that is open and due no health check, the packed command
is written with ``sendall`` directly, with redis-py's errors:

* a timeout disconnects the connection and raises redis-py's ``TimeoutError``;
* an ``OSError`` disconnects it and raises ``ConnectionError`` with the errno;
* anything else (a ``KeyboardInterrupt`` mid-write) disconnects it and is raised as it is,
  so that no half-written command is left on a connection that goes back to the pool.

A connection that is not connected, or due its health check (``health_check_interval``), is
sent through redis-py's own ``send_packed_command``, which connects, PINGs and writes; so is
any connection whose class sends its own way (a subclass overriding the method), or whose
internals are not the ones mirrored here (no ``_sock``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import redis.connection
from redis.exceptions import TimeoutError as RedisTimeoutError

from .redis_send import write_failed

__all__ = ["send_packed_sync"]

_REDIS_PY_SEND = getattr(redis.connection, "AbstractConnection", None)
_REDIS_PY_SEND = getattr(_REDIS_PY_SEND, "send_packed_command", None)


def send_packed_sync(connection: Any, command: Iterable[bytes]) -> None:
    """Write ``command`` (packed: ``connection.pack_command(...)``) on ``connection``."""
    sock = _socket_for(connection)
    if sock is None:
        connection.send_packed_command(command)
        return
    try:
        for part in command:
            sock.sendall(part)
    except TimeoutError:  # (socket.timeout)
        connection.disconnect()
        raise RedisTimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        connection.disconnect()
        raise write_failed(exc) from exc
    except BaseException:
        connection.disconnect()
        raise


def _socket_for(connection: Any) -> Any:
    """The connection's socket when the command may be written on it here; None when
    redis-py's own send must do it (not connected, a health check due, a class or a redis-py
    this module does not mirror)."""
    if type(connection).send_packed_command is not _REDIS_PY_SEND:
        return None
    sock = getattr(connection, "_sock", None)
    if sock is None:
        return None
    interval = getattr(connection, "health_check_interval", None)
    if interval and time.monotonic() > connection.next_health_check:
        return None
    return sock
