"""Response streams that show every chunk to a ``Meter`` and pass it on at once.

A chunk is handed to the reader and yielded in the same step: nothing is buffered, nothing
waits for the next chunk (the built-in readers look at what they are handed a few KiB at a
time, which costs the stream nothing). The usage is settled (read and recorded) exactly once:

* when the inner stream is exhausted: complete;
* when it raises (a dropped connection): what was seen, partial, then the error goes on;
* when the client closes it before the end (``break`` out of ``iter_lines``, an SDK stream
  closed early): what was seen, partial.

Each client checks that a response stream is an instance of its own library's
``SyncByteStream``/``AsyncByteStream``, so the concrete classes are built once per library
from the mixins below (``sync_stream_type``/``async_stream_type``).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, Protocol, cast

from .compat import Flavor
from .meter import Meter

__all__ = ["AsyncMeteredStream", "MeteredStream", "async_stream_type", "sync_stream_type"]

Settle = Callable[[Meter, bool], None]
ASettle = Callable[[Meter, bool], Awaitable[None]]


class _InnerStream(Iterable[bytes], Protocol):
    def close(self) -> None: ...


class _AsyncInnerStream(AsyncIterable[bytes], Protocol):
    async def aclose(self) -> None: ...


class MeteredStream:
    """Sync mixin: iterate the inner stream, feed the meter, settle at the end or on close."""

    def __init__(self, inner: _InnerStream, meter: Meter, settle: Settle) -> None:
        self._inner = inner
        self._meter = meter
        self._settle = settle

    def __iter__(self) -> Iterator[bytes]:
        feed = self._meter.feeder()
        try:
            for chunk in self._inner:
                feed(chunk)
                yield chunk
        except GeneratorExit:
            raise  # the consumer stopped early; close() settles what was seen
        except BaseException:
            self._settle(self._meter, False)
            raise
        self._settle(self._meter, True)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._settle(self._meter, False)


class AsyncMeteredStream:
    """Async mixin: the same as ``MeteredStream`` with ``async for`` and ``aclose``."""

    def __init__(self, inner: _AsyncInnerStream, meter: Meter, settle: ASettle) -> None:
        self._inner = inner
        self._meter = meter
        self._settle = settle

    async def __aiter__(self) -> AsyncIterator[bytes]:
        feed = self._meter.feeder()
        try:
            async for chunk in self._inner:
                feed(chunk)
                yield chunk
        except Exception:
            await self._settle(self._meter, False)
            raise
        # GeneratorExit and cancellation: aclose() settles, outside the dying generator.
        await self._settle(self._meter, True)

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            await self._settle(self._meter, False)


_sync_types: dict[str, type[MeteredStream]] = {}
_async_types: dict[str, type[AsyncMeteredStream]] = {}


def sync_stream_type(flavor: Flavor) -> type[MeteredStream]:
    """``MeteredStream`` as a ``SyncByteStream`` of ``flavor``'s library."""
    kind = _sync_types.get(flavor.name)
    if kind is None:
        bases: tuple[type[Any], ...] = (MeteredStream, flavor.sync_stream_base)
        kind = _sync_types[flavor.name] = cast(
            "type[MeteredStream]", type("MeteredStream", bases, {"__module__": __name__})
        )
    return kind


def async_stream_type(flavor: Flavor) -> type[AsyncMeteredStream]:
    """``AsyncMeteredStream`` as an ``AsyncByteStream`` of ``flavor``'s library."""
    kind = _async_types.get(flavor.name)
    if kind is None:
        bases: tuple[type[Any], ...] = (AsyncMeteredStream, flavor.async_stream_base)
        kind = _async_types[flavor.name] = cast(
            "type[AsyncMeteredStream]",
            type("AsyncMeteredStream", bases, {"__module__": __name__}),
        )
    return kind
