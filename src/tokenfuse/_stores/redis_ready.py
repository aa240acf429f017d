"""Whether a pooled sync connection is ready for a command: nothing to read, in one poll.

redis-py's pools check every connection they hand out with ``can_read()``: nothing read and
left unconsumed, no reply or end of stream waiting on the socket. Its Python parser asks the
socket with a ``recv`` at a zero timeout, between two ``settimeout`` calls (three system calls
and a dozen Python calls, a few microseconds on every command). When nothing is buffered in
the parser and ``select`` finds the socket not readable (no data, no end of stream, no error),
that ``recv`` would find nothing and ``can_read()`` would say False: so this says so, with one
system call. Whenever it cannot tell (a parser or socket of another kind, hiredis's, TLS's own
buffer, a descriptor past ``select``'s limit), or something may be there, it says False, and
redis-py's ``can_read()`` decides as ever.
"""

from __future__ import annotations

import select
import socket
from typing import Any

import redis

__all__ = ["check_pooled", "nothing_to_read"]

try:  # redis-py's Python parser and its buffer, as mirrored here
    from redis._parsers.base import _RESPBase
    from redis._parsers.socket import SocketBuffer

    _PARSER_CAN_READ: Any = _RESPBase.can_read
    _BUFFER: Any = SocketBuffer
except ImportError:  # pragma: no cover - depends on the redis-py installed
    _PARSER_CAN_READ = _BUFFER = None


def nothing_to_read(connection: Any) -> bool:
    """True when ``connection.can_read()`` would say False: nothing to read; False when it
    may not (or this cannot tell): then ask ``can_read()``."""
    parser: Any = getattr(connection, "_parser", None)
    if _BUFFER is None or type(parser).can_read is not _PARSER_CAN_READ:
        return False
    buffer, sock = parser._buffer, connection._sock
    # A plain socket only: a TLS socket may hold decrypted bytes no poll of its descriptor sees.
    if type(buffer) is not _BUFFER or type(sock) is not socket.socket or buffer._sock is not sock:
        return False
    if buffer.unread_bytes():
        return False
    try:
        readable, _, _ = select.select((sock,), (), (), 0)
    except (ValueError, OSError):  # a descriptor past select's FD_SETSIZE, say
        return False
    return not readable


def check_pooled(pool: Any, connection: Any) -> None:
    """``get_connection``'s check of a connection just taken from ``pool``, as redis-py makes
    it: connected, and nothing left to read, else reconnected once (or raising). With
    maintenance notifications on (redis-py's "auto" default), data waiting may be a
    notification, which the next read handles: redis-py lets that connection be, and so does
    this."""
    if not connection.is_connected:
        connection.connect()
    if nothing_to_read(connection):  # what can_read() would say, with one poll
        return
    notified = pool.maint_notifications_enabled()
    try:
        if connection.can_read() and not notified:
            raise redis.ConnectionError("Connection has data")
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        connection.disconnect()
        connection.connect()
        if connection.can_read() and not notified:
            raise redis.ConnectionError("Connection not ready") from None
