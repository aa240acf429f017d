"""A command written on a pooled asyncio connection as redis-py writes it, minus a Task.

redis-py's asyncio ``send_packed_command`` bounds the write by the socket timeout with
``asyncio.wait_for(drain(), socket_timeout)``; before Python 3.12, ``wait_for`` of a
coroutine runs it as a Task of its own: a Task made, scheduled and finished, and two more
turns of the event loop, on every command. Yet the write itself never waits on the loop:
``writelines`` hands the bytes to the transport, which passes what the kernel takes at once
and buffers the rest, and ``drain`` waits only while the transport is paused, which it is
only once its buffer grew past the high-water mark (64 KiB) and until it drains again. A
decision's command is a few hundred bytes. So here, on a connection that is open and due no
health check:

* the command is written; if the transport's buffer is empty after it, ``drain`` cannot
  wait (it still raises what redis-py's would: the reader's error, a lost connection), and
  it is awaited as it is, in the calling task;
* if some of the command is left in the buffer (a large command, or a peer that stopped
  reading), ``drain`` is awaited under the socket timeout as redis-py awaits it;
* errors are redis-py's: a timeout disconnects the connection and raises redis-py's
  ``TimeoutError``, an ``OSError`` disconnects it and raises ``ConnectionError`` with the
  errno, anything else (cancellation included) disconnects it and is raised as it is, so
  that no half-written command is left on a connection that goes back to the pool.

A connection that is not connected, or due its health check (``health_check_interval``), is
sent through redis-py's own ``send_packed_command``, which connects, checks and writes; so is
any connection whose class sends its own way (a subclass overriding the method), or whose
internals are not the ones mirrored here (no stream writer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import redis.asyncio.connection
from redis._parsers.encoders import Encoder
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["pack", "send_packed", "write_failed"]

_REDIS_PY_SEND = getattr(redis.asyncio.connection, "AbstractConnection", None)
_REDIS_PY_SEND = getattr(_REDIS_PY_SEND, "send_packed_command", None)


#: Each codec's packed words (``$<length>\r\n<bytes>\r\n``) of text and whole numbers: a
#: decision's command is mostly the same few (its command, function, key count and key),
#: packed once, not on every call. Bytes (the call's arguments, new each time) are not kept.
_PACKED: dict[tuple[str, str], dict[str | int, bytes]] = {}
_PACKED_MAX = 1_024  # per codec: a word for each key, and keys are a process's callers


def pack(connection: Any, words: tuple[Any, ...]) -> list[bytes]:
    """``words`` in the protocol, as ``connection.pack_command(*words)`` packs them, in half
    its time: a decision's words are text (encoded with the codec of the connection's own
    encoder, as its ``encode`` does), bytes and whole numbers, joined once. Any other word (a
    float, a memoryview), a command name with a space (redis-py splits it into words), or an
    encoder of another class, is left to ``pack_command``."""
    first, encoder = words[0], connection.encoder
    if type(first) is not str or " " in first or type(encoder) is not Encoder:
        return connection.pack_command(*words)  # type: ignore[no-any-return]
    codec, errors = encoder.encoding, encoder.encoding_errors  # what Encoder.encode does to text
    packed = _PACKED.get((codec, errors))
    if packed is None:
        packed = _PACKED[(codec, errors)] = {}
    parts = [b"*%d\r\n" % len(words)]
    for word in words:
        kind = type(word)
        if kind is bytes:
            parts += (b"$%d\r\n" % len(word), word, b"\r\n")
            continue
        if kind is str:
            chunk = packed.get(word)
            if chunk is None:
                chunk = _packed_word(packed, word, word.encode(codec, errors))
        elif kind is int:
            chunk = packed.get(word)
            if chunk is None:
                chunk = _packed_word(packed, word, b"%d" % word)
        else:
            return connection.pack_command(*words)  # type: ignore[no-any-return]
        parts.append(chunk)
    return [b"".join(parts)]


def _packed_word(packed: dict[str | int, bytes], word: str | int, data: bytes) -> bytes:
    """``word`` (encoded: ``data``) packed, and kept (the table bounded: cleared when full)."""
    chunk = b"$%d\r\n%b\r\n" % (len(data), data)
    if len(packed) >= _PACKED_MAX:
        packed.clear()
    packed[word] = chunk
    return chunk


async def send_packed(connection: Any, command: Iterable[bytes]) -> None:
    """Write ``command`` (packed: ``connection.pack_command(...)``) on ``connection``."""
    writer = _writer_for(connection)
    if writer is None:
        await connection.send_packed_command(command)
        return
    try:
        writer.writelines(command)
        timeout = connection.socket_timeout
        if timeout and writer.transport.get_write_buffer_size():
            await asyncio.wait_for(writer.drain(), timeout)  # it may wait: bounded
        else:
            await writer.drain()  # an empty buffer: the transport is not paused
    except asyncio.TimeoutError:
        await connection.disconnect(nowait=True)
        raise RedisTimeoutError("Timeout writing to socket") from None
    except OSError as exc:
        await connection.disconnect(nowait=True)
        raise write_failed(exc) from exc
    except BaseException:
        await connection.disconnect(nowait=True)
        raise


def write_failed(exc: OSError) -> RedisConnectionError:
    """redis-py's error for a write the socket refused, with its errno as redis-py says it."""
    if len(exc.args) == 1:
        number, message = "UNKNOWN", exc.args[0]
    else:
        number, message = exc.args[0], exc.args[1]
    return RedisConnectionError(f"Error {number} while writing to socket. {message}.")


def _writer_for(connection: Any) -> Any:
    """The connection's stream writer when the command may be written on it here; None when
    redis-py's own send must do it (not connected, a health check due, a class or a
    redis-py this module does not mirror)."""
    if type(connection).send_packed_command is not _REDIS_PY_SEND:
        return None
    writer = getattr(connection, "_writer", None)
    if writer is None or getattr(connection, "_reader", None) is None:
        return None
    if not isinstance(writer, asyncio.StreamWriter):
        return None
    interval = getattr(connection, "health_check_interval", None)
    if interval and asyncio.get_running_loop().time() > connection.next_health_check:
        return None
    return writer
