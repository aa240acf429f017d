"""Response streams that show every chunk to a ``Meter`` and pass it on at once.

A chunk is yielded as soon as it arrives: nothing waits for the next chunk. On its way it is
put in the meter's batch (``Meter.collector``: a list append, no Python call per chunk), which
the reader reads every ``BATCH`` bytes and at the end. The usage is settled (read and
recorded) exactly once:

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

from .._usage.readers import BATCH
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


def _ignore(chunk: bytes) -> None:
    pass


def _nothing() -> None:
    pass


def _keeper(
    collector: tuple[list[bytes], Callable[[], None]] | None,
) -> tuple[Callable[[bytes], None], Callable[[], None]]:
    """The usage reader's batch to keep each chunk in and its flush (``Meter.collector``);
    nothing to do when there is no reader, and only a watch looks at the chunks."""
    if collector is None:
        return _ignore, _nothing
    batch, flush = collector
    return batch.append, flush


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
        collector, watch = self._meter.collector(), self._watch
        try:
            if collector is None and watch is None:  # nothing to read, no one watching
                for chunk in self._inner:
                    yield chunk
            else:
                keep, flush = _keeper(collector)
                held = 0
                for chunk in self._inner:
                    keep(chunk)
                    held += len(chunk)
                    if held >= BATCH:
                        flush()
                        held = 0
                    if watch is not None:
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
                if not self._meter.report.done:  # else settled at the end of the stream
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
        collector, watch = self._meter.collector(), self._watch
        try:
            if collector is None and watch is None:  # nothing to read, no one watching
                async for chunk in self._inner:
                    yield chunk
            else:
                keep, flush = _keeper(collector)
                held = 0
                async for chunk in self._inner:
                    keep(chunk)
                    held += len(chunk)
                    if held >= BATCH:
                        flush()
                        held = 0
                    if watch is not None:
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
                if not self._meter.report.done:  # else settled at the end of the stream
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
