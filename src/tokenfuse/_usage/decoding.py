"""Incremental, bounded decoding of a copy of a compressed response body.

The transport passes the raw chunks on untouched (decoding happens above it, in the client);
we decode a copy only to read usage. Each content-coding is a stage that takes input with
`write` and gives out at most `limit` bytes per `read`, so a small compressed chunk can never
expand into a huge buffer at once (zip bomb). The chain as a whole stops after `MAX_DECODED`
bytes: beyond that the rest of the body is not inspected and the reader reports a problem.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

PIECE = 256 * 1024  # decoded bytes handed to a framer at a time
MAX_DECODED = 128 * 1024 * 1024  # decoded bytes inspected per response at most
MAX_CODINGS = 4  # more stacked codings than this is an attack, not a server

_GZIP_WBITS = 16 + zlib.MAX_WBITS


class UnsupportedEncoding(ValueError):
    """A content-coding we cannot decode (the message is the reader's problem text)."""


class _Stage(Protocol):
    def write(self, data: bytes) -> None: ...

    def read(self, limit: int) -> bytes:
        """Up to about `limit` decoded bytes; b"" when more input is needed."""
        ...


class _Zlib:
    """gzip and zlib-wrapped deflate. Concatenated gzip members are valid gzip and decoded too."""

    __slots__ = ("_d", "_pending", "_wbits")

    def __init__(self, wbits: int) -> None:
        self._wbits = wbits
        self._d = zlib.decompressobj(wbits)
        self._pending = b""

    def write(self, data: bytes) -> None:
        self._pending += data

    def read(self, limit: int) -> bytes:
        while self._pending:
            if self._d.eof:
                if self._wbits != _GZIP_WBITS:
                    self._pending = b""  # bytes after the end of a deflate stream are not body
                    break
                self._d = zlib.decompressobj(self._wbits)
            out = self._d.decompress(self._pending, limit)
            self._pending = self._d.unused_data if self._d.eof else self._d.unconsumed_tail
            if out:
                return out
        return b""


class _Deflate:
    """HTTP `deflate` is meant to be zlib-wrapped (RFC 9110), but some servers send raw deflate.
    The first two bytes tell them apart: a zlib header is method 8 and a multiple of 31."""

    __slots__ = ("_head", "_inner")

    def __init__(self) -> None:
        self._head = b""
        self._inner: _Zlib | None = None

    def write(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.write(data)
            return
        self._head += data
        if len(self._head) >= 2:
            cmf, flg = self._head[0], self._head[1]
            wrapped = cmf & 0x0F == 8 and cmf >> 4 <= 7 and ((cmf << 8) | flg) % 31 == 0
            self._inner = _Zlib(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
            self._inner.write(self._head)

    def read(self, limit: int) -> bytes:
        return self._inner.read(limit) if self._inner is not None else b""


class _Brotli:
    __slots__ = ("_d", "_pending")

    def __init__(self, module: Any) -> None:
        self._d = module.Decompressor()
        self._pending = b""

    def write(self, data: bytes) -> None:
        self._pending += data

    def read(self, limit: int) -> bytes:
        # brotli >= 1.2 bounds its output; until it can accept input again it must be drained.
        if not self._d.can_accept_more_data():
            return bytes(self._d.process(b"", output_buffer_limit=limit))
        data, self._pending = self._pending, b""
        return bytes(self._d.process(data, output_buffer_limit=limit)) if data else b""


class _Bounded:
    """Decompressors with the lzma/bz2/`compression.zstd` API (`max_length`, `needs_input`)."""

    __slots__ = ("_d", "_pending")

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._d = factory()
        self._pending = b""

    def write(self, data: bytes) -> None:
        self._pending += data

    def read(self, limit: int) -> bytes:
        if self._d.eof or (not self._pending and self._d.needs_input):
            return b""
        data, self._pending = self._pending, b""
        return bytes(self._d.decompress(data, limit))


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


_brotli = _optional("brotli")
if _brotli is not None and not hasattr(_brotli.Decompressor(), "can_accept_more_data"):
    _brotli = None  # brotli < 1.2 cannot bound its output: refuse rather than risk a bomb
_zstd = _optional("compression.zstd")  # Python 3.14+; the `zstandard` package has no bounded API


def _stage(coding: str) -> _Stage:
    if coding in ("gzip", "x-gzip"):
        return _Zlib(_GZIP_WBITS)
    if coding == "deflate":
        return _Deflate()
    if coding == "br" and _brotli is not None:
        return _Brotli(_brotli)
    if coding == "zstd" and _zstd is not None:
        return _Bounded(_zstd.ZstdDecompressor)
    raise UnsupportedEncoding(f"{coding} not decodable")


class BodyDecoder:
    """Decodes chunks through a chain of content-codings, yielding bounded pieces.

    Never raises: a decoding error or the size bound sets `problem` and ends the output.
    """

    __slots__ = ("_left", "_name", "_stages", "problem")

    def __init__(self, stages: list[_Stage], name: str, limit: int) -> None:
        self._stages = stages
        self._name = name
        self._left = limit
        self.problem: str | None = None

    def decode(self, chunk: bytes) -> Iterator[bytes]:
        if self.problem is not None:
            return
        last = len(self._stages) - 1
        try:
            self._stages[0].write(chunk)
            while True:
                piece = self._pull(last, min(PIECE, self._left + 1))
                if not piece:
                    return
                if len(piece) > self._left:
                    self.problem = "decoded body too large; rest not inspected"
                    return
                self._left -= len(piece)
                yield piece
        except Exception:  # zlib.error, brotli.error, ...: the libraries share no base class
            self.problem = f"{self._name} body could not be decoded"

    def _pull(self, index: int, limit: int) -> bytes:
        stage = self._stages[index]
        while True:
            out = stage.read(limit)
            if out or index == 0:
                return out
            upstream = self._pull(index - 1, PIECE)
            if not upstream:
                return b""
            stage.write(upstream)


def make_decoder(content_encoding: str | None, limit: int | None = None) -> BodyDecoder | None:
    """The decoder for a Content-Encoding header value; None when the body is not encoded.

    Codings are listed in the order they were applied, so they are undone in reverse.
    Raises UnsupportedEncoding for a coding we cannot (or will not) decode.
    """
    if not content_encoding:
        return None
    codings = [c.strip().lower() for c in content_encoding.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return None
    if len(codings) > MAX_CODINGS:
        raise UnsupportedEncoding("too many content-codings")
    stages = [_stage(c) for c in reversed(codings)]
    return BodyDecoder(stages, ", ".join(codings), MAX_DECODED if limit is None else limit)
