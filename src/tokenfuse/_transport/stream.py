"""Response streams that show every chunk to a ``Meter`` and pass it on at once.

A chunk is handed to the reader and yielded in the same step: nothing is buffered, nothing
waits for the next chunk (the built-in readers look at what they are handed a few KiB at a
time, which costs the stream nothing). The usage is settled (read and recorded) exactly once:

* when the inner stream is exhausted: complete;
* when it raises (a dropped connection): what was seen, partial, then the error goes on;
* when the client closes it before the end (``break`` out of ``iter_lines``, an SDK stream
  closed early): what was seen, partial.

The start of an error body can also be read before the response is returned (to see whether a
server refused the usage option, ``usage_option``): ``read_head`` takes it, and a
``ReplayedStream`` gives the client the whole body all the same.

Each client checks that a response stream is an instance of its own library's
``SyncByteStream``/``AsyncByteStream``, so the concrete classes are built once per library
from the mixins below (``sync_stream_type``/``async_stream_type``).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar, cast

from .compat import Flavor
from .meter import Meter

__all__ = [
    "AsyncMeteredStream",
    "AsyncReplayedStream",
    "MeteredStream",
    "ReplayedStream",
    "aread_head",
    "async_replayed_type",
    "async_stream_type",
    "read_head",
    "replayed_type",
    "sync_stream_type",
]

Settle = Callable[[Meter, bool], None]
ASettle = Callable[[Meter, bool], Awaitable[None]]


class _InnerStream(Iterable[bytes], Protocol):
    def close(self) -> None: ...


class _AsyncInnerStream(AsyncIterable[bytes], Protocol):
    async def aclose(self) -> None: ...


class MeteredStream:
    """Sync mixin: iterate the inner stream, feed the meter, settle at the end or on close.

    Another step can ``attach`` its own look at the chunks (the failure-loop watch): it is
    fed in the same loop and ended after the settling, so a stream pays for one generator
    however many steps watch it (a generator layer per step cost more than the steps)."""

    _watch: Callable[[bytes], None] | None = None
    _done: Callable[[], None] | None = None

    def __init__(self, inner: _InnerStream, meter: Meter, settle: Settle) -> None:
        self._inner = inner
        self._meter = meter
        self._settle = settle

    def attach(self, watch: Callable[[bytes], None], done: Callable[[], None]) -> bool:
        """Show every chunk to ``watch`` too, after the meter; call ``done`` when the stream
        ends or is closed, after settling (an error leaves it to ``close``). Before reading.
        False: the stream has a watch already (another transport's, nested), left as it is."""
        if self._watch is not None:
            return False
        self._watch, self._done = watch, done
        return True

    def __iter__(self) -> Iterator[bytes]:
        feed, watch = self._meter.feeder(), self._watch
        try:
            if watch is None:
                for chunk in self._inner:
                    feed(chunk)
                    yield chunk
            else:  # the same loop, written twice: a call per chunk saved where none watches
                for chunk in self._inner:
                    feed(chunk)
                    watch(chunk)
                    yield chunk
        except GeneratorExit:
            raise  # the consumer stopped early; close() settles what was seen
        except BaseException:
            self._settle(self._meter, False)
            raise
        self._settle(self._meter, True)
        if self._done is not None:
            self._done()

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            try:
                self._settle(self._meter, False)
            finally:
                if self._done is not None:
                    self._done()


class AsyncMeteredStream:
    """Async mixin: the same as ``MeteredStream`` with ``async for`` and ``aclose``."""

    _watch: Callable[[bytes], None] | None = None
    _done: Callable[[], Awaitable[None]] | None = None

    def __init__(self, inner: _AsyncInnerStream, meter: Meter, settle: ASettle) -> None:
        self._inner = inner
        self._meter = meter
        self._settle = settle

    def attach(self, watch: Callable[[bytes], None], done: Callable[[], Awaitable[None]]) -> bool:
        """As ``MeteredStream.attach``, ``done`` awaited."""
        if self._watch is not None:
            return False
        self._watch, self._done = watch, done
        return True

    async def __aiter__(self) -> AsyncIterator[bytes]:
        feed, watch = self._meter.feeder(), self._watch
        try:
            if watch is None:
                async for chunk in self._inner:
                    feed(chunk)
                    yield chunk
            else:
                async for chunk in self._inner:
                    feed(chunk)
                    watch(chunk)
                    yield chunk
        except Exception:
            await self._settle(self._meter, False)
            raise
        # GeneratorExit and cancellation: aclose() settles, outside the dying generator.
        await self._settle(self._meter, True)
        if self._done is not None:
            await self._done()

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            try:
                await self._settle(self._meter, False)
            finally:
                if self._done is not None:
                    await self._done()


def read_head(stream: _InnerStream, limit: int) -> tuple[bytes, Iterator[bytes]]:
    """The first ``limit`` bytes (about) of ``stream``, and the iterator of the rest."""
    rest = iter(stream)
    head = b""
    for chunk in rest:
        head += chunk
        if len(head) >= limit:
            break
    return head, rest


async def aread_head(stream: _AsyncInnerStream, limit: int) -> tuple[bytes, AsyncIterator[bytes]]:
    """The async form of ``read_head``."""
    rest = aiter(stream)
    head = b""
    async for chunk in rest:
        head += chunk
        if len(head) >= limit:
            break
    return head, rest


class ReplayedStream:
    """Sync mixin: a body whose head was read already, given whole: the head, then the rest."""

    def __init__(self, head: bytes, rest: Iterator[bytes], inner: _InnerStream) -> None:
        self._head = head
        self._rest = rest
        self._inner = inner

    def __iter__(self) -> Iterator[bytes]:
        if self._head:
            yield self._head
        yield from self._rest

    def close(self) -> None:
        self._inner.close()


class AsyncReplayedStream:
    """Async mixin: the same as ``ReplayedStream``."""

    def __init__(self, head: bytes, rest: AsyncIterator[bytes], inner: _AsyncInnerStream) -> None:
        self._head = head
        self._rest = rest
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._head:
            yield self._head
        async for chunk in self._rest:
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


T = TypeVar("T")
_types: dict[tuple[type[Any], str], type[Any]] = {}


def _of_library(mixin: type[T], base: type[Any], flavor: Flavor) -> type[T]:
    """``mixin`` as a stream class of ``flavor``'s library (``base`` is its stream base)."""
    kind = _types.get((mixin, flavor.name))
    if kind is None:
        namespace = {"__module__": __name__}
        kind = _types[(mixin, flavor.name)] = type(mixin.__name__, (mixin, base), namespace)
    return cast("type[T]", kind)


def sync_stream_type(flavor: Flavor) -> type[MeteredStream]:
    """``MeteredStream`` as a ``SyncByteStream`` of ``flavor``'s library."""
    return _of_library(MeteredStream, flavor.sync_stream_base, flavor)


def async_stream_type(flavor: Flavor) -> type[AsyncMeteredStream]:
    """``AsyncMeteredStream`` as an ``AsyncByteStream`` of ``flavor``'s library."""
    return _of_library(AsyncMeteredStream, flavor.async_stream_base, flavor)


def replayed_type(flavor: Flavor) -> type[ReplayedStream]:
    """``ReplayedStream`` as a ``SyncByteStream`` of ``flavor``'s library."""
    return _of_library(ReplayedStream, flavor.sync_stream_base, flavor)


def async_replayed_type(flavor: Flavor) -> type[AsyncReplayedStream]:
    """``AsyncReplayedStream`` as an ``AsyncByteStream`` of ``flavor``'s library."""
    return _of_library(AsyncReplayedStream, flavor.async_stream_base, flavor)
