"""Incremental decoder for AWS `application/vnd.amazon.eventstream` (Bedrock streams).

A message is: total length (4 bytes), headers length (4), prelude CRC32 of those 8 bytes (4),
headers, payload, message CRC32 of everything before it (4); integers big-endian. A header is
name length (1), name, value type (1), value; strings and byte arrays carry a 2-byte length.

A bad prelude CRC means the lengths cannot be trusted, so nothing after it can be framed: we
stop. A bad message CRC (lengths verified) drops that message only. Both are malformed input.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
import zlib

from .accumulator import Accumulator

MAX_MESSAGE = 1024 * 1024  # larger messages are skipped unread (Bedrock's usage events are tiny)

_PRELUDE = struct.Struct(">III")
_OVERHEAD = 16  # prelude (12) + message CRC (4)
_FIXED_SIZES = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}  # value type -> bytes
_STRING, _BYTES = 7, 6


def parse_headers(raw: bytes) -> dict[bytes, bytes] | None:
    """String-valued headers by name; None when the header block is malformed."""
    headers: dict[bytes, bytes] = {}
    at, end = 0, len(raw)
    while at < end:
        name_end = at + 1 + raw[at]
        name = raw[at + 1 : name_end]
        if name_end >= end:
            return None
        kind, at = raw[name_end], name_end + 1
        if kind in (_STRING, _BYTES):
            if at + 2 > end:
                return None
            size = int.from_bytes(raw[at : at + 2], "big")
            at += 2
        elif kind in _FIXED_SIZES:
            size = _FIXED_SIZES[kind]
        else:
            return None
        if at + size > end:
            return None
        if kind == _STRING:
            headers[name] = raw[at : at + size]
        at += size
    return headers


def _unwrap_chunk(payload: bytes) -> bytes:
    """InvokeModelWithResponseStream wraps each model event as {"bytes": "<base64>"}."""
    try:
        wrapped = json.loads(payload)
        return base64.b64decode(wrapped["bytes"], validate=True)
    except (ValueError, KeyError, TypeError, RecursionError, binascii.Error):
        return b""


class EventStreamFramer:
    """Hands each verified message to the accumulator as (event type, payload).

    Exceptions (`:message-type` other than `event`) are passed as an `error` event.
    """

    __slots__ = ("_buf", "_dead", "_sink", "_skip")

    def __init__(self, sink: Accumulator) -> None:
        self._sink = sink
        self._buf = bytearray()
        self._skip = 0  # bytes of an oversized message still to discard
        self._dead = False

    def feed(self, chunk: bytes) -> None:
        if self._dead:
            return
        if self._skip:
            skipped = min(self._skip, len(chunk))
            self._skip -= skipped
            chunk = chunk[skipped:]
        self._buf += chunk
        buf = self._buf
        while len(buf) >= 12:
            total, headers_len, prelude_crc = _PRELUDE.unpack_from(buf)
            if zlib.crc32(buf[:8]) != prelude_crc or headers_len > total - _OVERHEAD:
                self._dead = True
                buf.clear()
                self._sink.stop("malformed eventstream (prelude CRC mismatch)")
                return
            if total > MAX_MESSAGE:
                self._sink.note("eventstream message over 1 MiB skipped")
                self._skip = max(0, total - len(buf))
                del buf[:total]
                continue
            if len(buf) < total:
                return
            message = bytes(buf[:total])
            del buf[:total]
            self._message(message, headers_len)

    def close(self, complete: bool) -> None:
        if complete and self._buf and not self._dead:
            self._sink.note("eventstream ended inside a message")

    def _message(self, message: bytes, headers_len: int) -> None:
        if zlib.crc32(message[:-4]) != int.from_bytes(message[-4:], "big"):
            self._sink.note("malformed eventstream (message CRC mismatch)")
            return
        headers = parse_headers(message[12 : 12 + headers_len])
        if headers is None:
            self._sink.note("malformed eventstream headers")
            return
        payload = message[12 + headers_len : -4]
        name = headers.get(b":event-type", b"")
        if headers.get(b":message-type", b"event") != b"event":
            name = b"error"
        elif name == b"chunk":
            payload = _unwrap_chunk(payload)
        self._sink.event(name, payload)
