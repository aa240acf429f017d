"""Response streams that show every chunk to a ``Meter`` and pass it on at once.

A chunk is yielded as soon as it arrives, unchanged: nothing waits for the next chunk. On its
way it is put in the stream's batch (a list append, no Python call per chunk); once the
batch holds ``BATCH`` bytes (measured every ``GATHER`` chunks), and before settling, it is
joined and shown whole to the usage reader (``Meter.stream_reader``) and to the failure-loop
watch, if one is ``attach``ed. The usage is settled (read and recorded) exactly once, after
the last batch is shown:

* when the inner stream is exhausted: complete;
* when it raises (a dropped connection): what was seen, partial, then the error goes on;
* when the client closes it before the end (``break`` out of ``iter_lines``, an SDK stream
  closed early): what was seen, partial.

A chunk that is not bytes (a broken inner transport's) is passed on as it is all the same,
with a warning when it is measured; it cannot be read, so the call's usage is settled as
partial.

The start of an error body can also be read before the response is returned (to see whether a
server refused the usage option, ``usage_option``): ``read_head`` takes it, and a
``ReplayedStream`` gives the client the whole body all the same.

Each client checks that a response stream is an instance of its own library's
``SyncByteStream``/``AsyncByteStream``, so the concrete classes are built once per library
from the mixins below (``sync_stream_type``/``async_stream_type``).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from itertools import islice
from typing import Any, Protocol, TypeVar

from .._events import logger
from .._usage.scan import ErrorFind
from .compat import Flavor
from .meter import Meter

__all__ = [
    "BATCH",
    "GATHER",
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

#: Bytes of chunks a stream gathers before the reader and the watch look at them, joined. A
#: look pays a fixed cost whatever its size (Python calls, a C-level search per thing looked
#: for), and a stream chunk is mostly one small event: the watch's look at every chunk was a
#: third of what the guard added to a 2,000-chunk stream. Nothing needs the answer sooner:
#: usage is recorded, and a failure noted, when the stream is settled, which first shows what
#: is left (no check acts mid-stream). The bound keeps small the memory held (chunks the
#: caller was given already) and the work left to the settle (see ``GATHER``).
BATCH = 32 * 1024

#: Chunks taken between two measures of the batch. Adding up each chunk's length as it passed
#: cost some 500 instructions a chunk in Python (a million on a 2,000-chunk stream, a quarter
#: of what the guard added to it); the chunks are counted in C instead (``islice``), and every
#: ``GATHER`` of them are joined into one piece, which ``len`` measures. So a batch is looked
#: at a little past ``BATCH`` bytes: it holds less than ``BATCH`` bytes plus ``GATHER`` chunks
#: (an SSE stream's chunks are some 100 bytes to a few KiB; httpx's own transports read at
#: most 64 KiB at a time, so 2 MiB at worst). The price: each chunk is copied twice, into its
#: piece, then into the batch, which costs less than a Python step per chunk.
GATHER = 32

Settle = Callable[[Meter, bool], None]
ASettle = Callable[[Meter, bool], Awaitable[None]]


class _InnerStream(Iterable[bytes], Protocol):
    def close(self) -> None: ...


class _AsyncInnerStream(AsyncIterable[bytes], Protocol):
    async def aclose(self) -> None: ...


class _Batched:
    """What both metered streams share: the chunks passed on since the last look (the latest
    ones as they came, the others gathered into pieces), and the look, which shows them joined
    to the usage reader and the watch."""

    _read: Callable[[bytes], None] | None = None  # the usage reader's feed, once iterating
    _watch: Callable[[bytes], None] | None = None
    _share: Callable[[ErrorFind], None] | None = None  # the watch's, to share its error search

    def __init__(self, meter: Meter) -> None:
        self._meter = meter
        self._taken: list[bytes] = []  # chunks passed on since the last gather
        self._pieces: list[bytes] = []  # the rest of the batch: gathered chunks, joined
        self._held = 0  # bytes in the pieces
        self._unread = False  # a chunk was not bytes: the body cannot be read whole

    def _looks(self) -> bool:
        """Start iterating: whether anyone looks at the chunks (else they are only passed on)."""
        self._read = self._meter.stream_reader()
        if self._read is not None and self._share is not None:
            # Both look for errors in the same batches: one search of each for both.
            errors = ErrorFind()
            self._meter.share_errors(errors)
            self._share(errors)
        return self._read is not None or self._watch is not None

    def _gather(self) -> None:
        """Join the chunks taken into a piece of the batch, then look if it holds ``BATCH``."""
        self._gather_taken()
        if self._held >= BATCH:
            self._look()

    def _gather_taken(self) -> None:
        taken = self._taken
        if not taken:
            return
        try:
            piece = b"".join(taken)
        except TypeError:  # something in it is not bytes
            piece = self._readable(taken)
        taken.clear()
        self._pieces.append(piece)
        self._held += len(piece)

    def _look(self) -> None:
        """Show the batch, joined, to the reader and the watch (neither raises)."""
        self._gather_taken()
        pieces = self._pieces
        if not pieces:
            return
        data = b"".join(pieces)
        pieces.clear()
        self._held = 0
        if self._read is not None:
            self._read(data)
        if self._watch is not None:
            self._watch(data)

    def _readable(self, chunks: list[Any]) -> bytes:
        """The chunks' bytes, less the chunks that are none (told once per stream)."""
        kept: list[bytes] = []
        for chunk in chunks:
            try:
                kept.append(bytes(memoryview(chunk)))  # any buffer: bytearray, memoryview
            except (TypeError, ValueError):  # none (a str, None), or a released view
                if not self._unread:
                    self._unread = True
                    self._meter.skipped(f"a chunk of type {type(chunk).__name__} skipped")
                    logger.warning(
                        "tokenfuse: a response stream gave a chunk of type %s, not bytes: "
                        "passed on as it is, but it cannot be read for usage, so this call's "
                        "usage is recorded as far as the rest of the body reports it (partial)",
                        type(chunk).__name__,
                    )
        return b"".join(kept)

    def _whole(self, complete: bool) -> bool:
        """Show what is left, then whether the body was read whole: to settle with."""
        self._look()
        return complete and not self._unread


class MeteredStream(_Batched):
    """Sync mixin: iterate the inner stream, show the chunks to the meter's reader a batch at a
    time, settle at the end or on close.

    Another step can ``attach`` its own look at the chunks (the failure-loop watch): it is
    shown the same batches and ended after the settling, so a stream pays for one generator
    and one join however many steps watch it (a generator layer per step cost more than the
    steps)."""

    _done: Callable[[], None] | None = None

    def __init__(self, inner: _InnerStream, meter: Meter, settle: Settle) -> None:
        super().__init__(meter)
        self._inner = inner
        self._settle = settle

    def attach(
        self,
        watch: Callable[[bytes], None],
        done: Callable[[], None],
        share: Callable[[ErrorFind], None] | None = None,
    ) -> bool:
        """Show every batch to ``watch`` too, after the reader; call ``done`` once, when the
        stream ends or is closed, after settling (an error leaves it to ``close``). Before
        reading.
        ``share`` takes the reader's search for errors (if the stream has a reader that
        searches), for the watch to use. False: the stream has a watch already (another
        transport's, nested), left as it is."""
        if self._watch is not None:
            return False
        self._watch, self._done, self._share = watch, done, share
        return True

    def __iter__(self) -> Iterator[bytes]:
        try:
            if not self._looks():  # nothing to read, no one watching
                for chunk in self._inner:
                    yield chunk
            else:
                # taken.append, not a bound method kept aside: CPython 3.11 specialises the call
                taken, chunks = self._taken, iter(self._inner)
                while True:
                    for chunk in islice(chunks, GATHER):  # counted in C
                        taken.append(chunk)
                        yield chunk
                    if len(taken) < GATHER:  # the inner stream ended (a gather empties it)
                        break
                    self._gather()
        except GeneratorExit:
            raise  # the consumer stopped early; close() settles what was seen
        except BaseException:
            self._settle(self._meter, self._whole(False))
            raise
        self._settle(self._meter, self._whole(True))
        done, self._done = self._done, None  # the close that follows has nothing to add
        if done is not None:
            done()

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            try:
                if not self._meter.report.done:  # else settled at the end of the stream
                    self._settle(self._meter, self._whole(False))
            finally:
                done, self._done = self._done, None  # None: told already, at the end
                if done is not None:
                    done()


class AsyncMeteredStream(_Batched):
    """Async mixin: the same as ``MeteredStream`` with ``async for`` and ``aclose``."""

    _done: Callable[[], Awaitable[None]] | None = None

    def __init__(self, inner: _AsyncInnerStream, meter: Meter, settle: ASettle) -> None:
        super().__init__(meter)
        self._inner = inner
        self._settle = settle

    def attach(
        self,
        watch: Callable[[bytes], None],
        done: Callable[[], Awaitable[None]],
        share: Callable[[ErrorFind], None] | None = None,
    ) -> bool:
        """As ``MeteredStream.attach``, ``done`` awaited."""
        if self._watch is not None:
            return False
        self._watch, self._done, self._share = watch, done, share
        return True

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            if not self._looks():  # nothing to read, no one watching
                async for chunk in self._inner:
                    yield chunk
            else:
                taken, left = self._taken, GATHER  # no islice for async iterators: counted
                async for chunk in self._inner:
                    taken.append(chunk)
                    yield chunk
                    left -= 1
                    if not left:  # after the chunk is given, as in __iter__
                        self._gather()
                        left = GATHER
        except Exception:
            await self._settle(self._meter, self._whole(False))
            raise
        # GeneratorExit and cancellation: aclose() settles, outside the dying generator.
        await self._settle(self._meter, self._whole(True))
        done, self._done = self._done, None  # the aclose that follows has nothing to add
        if done is not None:
            await done()

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            try:
                if not self._meter.report.done:  # else settled at the end of the stream
                    await self._settle(self._meter, self._whole(False))
            finally:
                done, self._done = self._done, None  # None: told already, at the end
                if done is not None:
                    await done()


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
    return kind  # a type[Any], which type checkers take as a type[T]: no runtime cast needed


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
