"""Streams: chunks pass at once; early ends and closes record what was seen, marked partial."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Iterator
from types import ModuleType, SimpleNamespace
from typing import Any, cast

import pytest

from tokenfuse import Fuse
from tokenfuse._transport import AsyncFuseTransport, FuseReport, FuseTransport
from tokenfuse._transport.stream import BATCH, GATHER, AsyncMeteredStream, MeteredStream

from .bodies import CASES, SSE, Case
from .conftest import ChunkServer, split

ANTHROPIC = CASES["anthropic-stream"]
NO_USAGE = CASES["openai-chat-stream-no-usage"]
# Up to the end of message_start: input 25 and output 1 were seen, the rest never came.
FIRST_EVENT = ANTHROPIC.body[: ANTHROPIC.body.index(b"\n\n") + 2]


class Scripted:
    """An inner transport whose stream logs when each chunk is produced, and may then fail."""

    def __init__(self, lib: ModuleType, chunks: list[bytes], fail_with: Exception | None = None):
        self.lib = lib
        self.chunks = chunks
        self.fail_with = fail_with
        self.log: list[str] = []

    def _stream(self) -> Any:
        script = self

        class Stream(self.lib.SyncByteStream, self.lib.AsyncByteStream):  # type: ignore[misc,name-defined]
            def __iter__(self) -> Iterator[bytes]:
                for number, chunk in enumerate(script.chunks):
                    script.log.append(f"sent {number}")
                    yield chunk
                if script.fail_with is not None:
                    raise script.fail_with

            async def __aiter__(self) -> AsyncIterator[bytes]:
                for chunk in self:
                    yield chunk

            def close(self) -> None:
                script.log.append("closed")

            async def aclose(self) -> None:
                self.close()

        return Stream()

    def handle_request(self, request: Any) -> Any:
        return self.lib.Response(200, headers={"content-type": SSE}, stream=self._stream())

    async def handle_async_request(self, request: Any) -> Any:
        return self.handle_request(request)

    def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


def test_each_chunk_reaches_the_client_before_the_next_is_read(lib: ModuleType, fuse: Fuse) -> None:
    inner = Scripted(lib, split(ANTHROPIC.body, "random"))
    with (
        lib.Client(transport=FuseTransport(inner, fuse=fuse)) as client,
        client.stream("POST", ANTHROPIC.url) as response,
    ):
        for number, _ in enumerate(response.iter_raw()):
            inner.log.append(f"got {number}")
    chunks = len(inner.chunks)
    expected = [event for n in range(chunks) for event in (f"sent {n}", f"got {n}")]
    assert inner.log == [*expected, "closed"]
    assert response.extensions["tokenfuse"].usage.total == 40


async def test_async_chunks_pass_one_by_one(lib: ModuleType, fuse: Fuse) -> None:
    inner = Scripted(lib, split(ANTHROPIC.body, "random"))
    async with (
        lib.AsyncClient(transport=AsyncFuseTransport(inner, fuse=fuse)) as client,
        client.stream("POST", ANTHROPIC.url) as response,
    ):
        number = 0
        async for _ in response.aiter_raw():
            inner.log.append(f"got {number}")
            number += 1
    expected = [event for n in range(len(inner.chunks)) for event in (f"sent {n}", f"got {n}")]
    assert inner.log == [*expected, "closed"]


def assert_partial(report: FuseReport, fuse: Fuse, total: float = 26) -> None:
    assert report.done
    assert report.usage is not None
    assert report.usage.partial
    assert report.usage.total == total
    assert fuse.status(report.identity).rate == total  # what was seen is recorded


def test_a_stream_closed_early_records_what_was_seen(lib: ModuleType, fuse: Fuse) -> None:
    server = ChunkServer(lib, ANTHROPIC, how="bytes")
    with (
        lib.Client(transport=FuseTransport(server.transport(), fuse=fuse)) as client,
        client.stream("POST", ANTHROPIC.url) as response,
    ):
        seen = b""
        for chunk in response.iter_raw():
            seen += chunk
            if seen == FIRST_EVENT:
                break  # the application stops reading after the first event
    report: FuseReport = response.extensions["tokenfuse"]
    assert server.closed  # the inner stream was closed as well
    assert_partial(report, fuse)


async def test_async_stream_closed_early(lib: ModuleType, fuse: Fuse) -> None:
    server = ChunkServer(lib, ANTHROPIC, how="bytes")
    async with (
        lib.AsyncClient(transport=AsyncFuseTransport(server.transport(), fuse=fuse)) as client,
        client.stream("POST", ANTHROPIC.url) as response,
    ):
        seen = b""
        async for chunk in response.aiter_raw():
            seen += chunk
            if seen == FIRST_EVENT:
                break
    assert server.closed
    assert_partial(response.extensions["tokenfuse"], fuse)


def test_a_dropped_connection_records_what_was_seen_and_raises(lib: ModuleType, fuse: Fuse) -> None:
    inner = Scripted(lib, [FIRST_EVENT], fail_with=lib.ReadError("connection reset"))
    with lib.Client(transport=FuseTransport(inner, fuse=fuse)) as client:
        response = client.send(client.build_request("POST", ANTHROPIC.url), stream=True)
        with pytest.raises(lib.ReadError, match="connection reset"):
            response.read()
    assert_partial(response.extensions["tokenfuse"], fuse)


async def test_async_dropped_connection(lib: ModuleType, fuse: Fuse) -> None:
    inner = Scripted(lib, [FIRST_EVENT], fail_with=lib.ReadError("connection reset"))
    async with lib.AsyncClient(transport=AsyncFuseTransport(inner, fuse=fuse)) as client:
        response = await client.send(client.build_request("POST", ANTHROPIC.url), stream=True)
        with pytest.raises(lib.ReadError):
            await response.aread()
        await response.aclose()
    assert_partial(response.extensions["tokenfuse"], fuse)


def test_usage_is_settled_once_even_when_closed_after_the_end(lib: ModuleType, fuse: Fuse) -> None:
    server = ChunkServer(lib, ANTHROPIC, how="random")
    with lib.Client(transport=FuseTransport(server.transport(), fuse=fuse)) as client:
        response = client.send(client.build_request("POST", ANTHROPIC.url), stream=True)
        response.read()
        response.close()
        response.close()
    report = response.extensions["tokenfuse"]
    assert not report.usage.partial
    assert fuse.status(report.identity).rate == 40


QUESTION = "Say hello, then ask how I am."
STREAM_REQUEST = json.dumps(
    {"model": "gpt-4o-mini", "stream": True, "messages": [{"role": "user", "content": QUESTION}]}
).encode()
# The documented rule: the bytes of the messages' strings, and of the streamed text, 4 a token
# (rounded up). The stream of NO_USAGE says "Hello, " then "world, how are you today?".
ESTIMATED_INPUT = -(-len("user" + QUESTION) // 4)
ESTIMATED_OUTPUT = -(-len("Hello, world, how are you today?") // 4)


def stream_twice(lib: ModuleType, transport: Any, case: Case) -> list[FuseReport]:
    with lib.Client(transport=transport) as client:
        return [
            client.post(case.url, headers=case.request_headers, content=STREAM_REQUEST).extensions[
                "tokenfuse"
            ]
            for _ in range(2)
        ]


def test_a_stream_without_usage_is_estimated_by_default(lib: ModuleType, fuse: Fuse) -> None:
    server = ChunkServer(lib, NO_USAGE)
    transport = FuseTransport(server.transport(), fuse=fuse, inject_usage=False)
    reports = stream_twice(lib, transport, NO_USAGE)
    for report in reports:
        usage = report.usage
        assert usage.estimated
        assert (usage.input, usage.output) == (ESTIMATED_INPUT, ESTIMATED_OUTPUT)
        assert usage.total == ESTIMATED_INPUT + ESTIMATED_OUTPUT
        assert "include_usage" in (usage.problem or "")
        assert not report.asked_usage
    assert server.requests[0].content == STREAM_REQUEST  # sent as it was made
    assert fuse.status(reports[0].identity).rate == 2 * (ESTIMATED_INPUT + ESTIMATED_OUTPUT)
    assert fuse.stats.usage.estimated == 2


def test_without_estimates_a_stream_without_usage_is_unknown_never_zero_and_warned(
    lib: ModuleType, fuse: Fuse, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tokenfuse")
    server = ChunkServer(lib, NO_USAGE)
    transport = FuseTransport(server.transport(), fuse=fuse, estimate=False, inject_usage=False)
    reports = stream_twice(lib, transport, NO_USAGE)
    for report in reports:
        assert report.usage.total is None
        assert not report.usage.estimated
        assert "include_usage" in (report.usage.problem or "")
        assert report.record is None
    assert fuse.status(reports[0].identity).rate == 0
    assert fuse.stats.usage.unknown == 2
    assert fuse.stats.usage_of(reports[0].identity).unknown == 2
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1  # the second call is counted, not logged again
    assert warnings[0].startswith("usage_unknown: ")
    assert "include_usage" in warnings[0]
    assert "estimate=True" in warnings[0]  # says how to get an estimate instead


# -- batches: the reader and the watch see the chunks a batch (BATCH bytes) at a time, measured
# -- every GATHER chunks ----------------------------------------------------------------------

OPENAI_URL = "https://api.openai.com/v1/chat/completions"
TEXT_EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"word "}}],"usage":null}\n\n'
USAGE_EVENT = (
    b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":30,'
    b'"total_tokens":42}}\n\n'
)
DONE = b"data: [DONE]\n\n"


def up_to_a_border() -> list[bytes]:
    """Text events, one a chunk, and an SSE comment: one chunk short of a gather, one byte
    short of a batch. The next chunk ends a batch."""
    count = GATHER - 2
    pad = BATCH - 1 - count * len(TEXT_EVENT)
    return [TEXT_EVENT] * count + [b":" + b"p" * (pad - 3) + b"\n\n"]


def usage_across_a_border(inside: int) -> list[bytes]:
    """A batch that ends ``inside`` bytes into the usage event, then one more batch and more."""
    more = [TEXT_EVENT] * (BATCH // len(TEXT_EVENT) + 1)
    return [*up_to_a_border(), USAGE_EVENT[:inside], USAGE_EVENT[inside:], *more, DONE]


CUTS = [1, USAGE_EVENT.index(b'"usage"') + 3, len(USAGE_EVENT) - 1]


def read_all(lib: ModuleType, fuse: Fuse, chunks: list[bytes]) -> tuple[list[bytes], FuseReport]:
    inner = Scripted(lib, chunks)
    with (
        lib.Client(transport=FuseTransport(inner, fuse=fuse)) as client,
        client.stream("POST", OPENAI_URL) as response,
    ):
        passed = list(response.iter_raw())
    return passed, response.extensions["tokenfuse"]


async def aread_all(
    lib: ModuleType, fuse: Fuse, chunks: list[bytes]
) -> tuple[list[bytes], FuseReport]:
    inner = Scripted(lib, chunks)
    async with (
        lib.AsyncClient(transport=AsyncFuseTransport(inner, fuse=fuse)) as client,
        client.stream("POST", OPENAI_URL) as response,
    ):
        passed = [chunk async for chunk in response.aiter_raw()]
    return passed, response.extensions["tokenfuse"]


def assert_whole(report: FuseReport, fuse: Fuse) -> None:
    assert report.done and report.usage is not None
    assert not report.usage.partial and report.usage.total == 42
    assert fuse.status(report.identity).rate == 42


@pytest.mark.parametrize("inside", CUTS)
def test_a_usage_event_cut_by_a_batch_border_is_read(
    lib: ModuleType, fuse: Fuse, inside: int
) -> None:
    chunks = usage_across_a_border(inside)
    passed, report = read_all(lib, fuse, chunks)
    assert passed == chunks  # each chunk as it came, none merged nor held back
    assert_whole(report, fuse)


@pytest.mark.parametrize("inside", CUTS)
async def test_async_a_usage_event_cut_by_a_batch_border_is_read(
    lib: ModuleType, fuse: Fuse, inside: int
) -> None:
    chunks = usage_across_a_border(inside)
    passed, report = await aread_all(lib, fuse, chunks)
    assert passed == chunks
    assert_whole(report, fuse)


@pytest.mark.parametrize("batches", [0, 2])
def test_usage_in_the_last_chunk_is_read(lib: ModuleType, fuse: Fuse, batches: int) -> None:
    """The last chunk ends no batch: the settle shows it to the reader first."""
    chunks = [TEXT_EVENT] * (batches * BATCH // len(TEXT_EVENT)) + [USAGE_EVENT]
    passed, report = read_all(lib, fuse, chunks)
    assert passed == chunks
    assert_whole(report, fuse)


async def test_async_usage_in_the_last_chunk_is_read(lib: ModuleType, fuse: Fuse) -> None:
    chunks = [*up_to_a_border(), USAGE_EVENT]  # the last chunk makes a batch, read at the end
    passed, report = await aread_all(lib, fuse, chunks)
    assert passed == chunks
    assert_whole(report, fuse)


# A stream that reported its usage, then went on past another batch border.
REPORTED_THEN_MORE = [*up_to_a_border(), USAGE_EVENT, *up_to_a_border(), TEXT_EVENT]
# The usage in a gathered piece, more chunks gathered after it, a few taken since: none of it
# looked at yet (far less than BATCH bytes), all of it shown when the stream is settled.
GATHERED_NOT_LOOKED_AT = [USAGE_EVENT, *[TEXT_EVENT] * (2 * GATHER + 3)]
# The chunks a caller reads before closing the stream: the last one seen is in a batch no one
# has looked at yet.
SEEN_BEFORE_CLOSING = pytest.mark.parametrize(
    "seen", [REPORTED_THEN_MORE, GATHERED_NOT_LOOKED_AT], ids=["after-batches", "before-a-look"]
)


@SEEN_BEFORE_CLOSING
def test_a_stream_closed_early_records_the_usage_seen(
    lib: ModuleType, fuse: Fuse, seen: list[bytes]
) -> None:
    inner = Scripted(lib, [*seen, *up_to_a_border(), DONE])
    with (
        lib.Client(transport=FuseTransport(inner, fuse=fuse)) as client,
        client.stream("POST", OPENAI_URL) as response,
    ):
        for number, _ in enumerate(response.iter_raw(), 1):
            if number == len(seen):
                break
    assert inner.log[-1] == "closed"
    assert_partial(response.extensions["tokenfuse"], fuse, 42)


@SEEN_BEFORE_CLOSING
async def test_async_stream_closed_early_records_the_usage_seen(
    lib: ModuleType, fuse: Fuse, seen: list[bytes]
) -> None:
    inner = Scripted(lib, [*seen, *up_to_a_border(), DONE])
    async with (
        lib.AsyncClient(transport=AsyncFuseTransport(inner, fuse=fuse)) as client,
        client.stream("POST", OPENAI_URL) as response,
    ):
        number = 0
        async for _ in response.aiter_raw():
            number += 1
            if number == len(seen):
                break
    assert_partial(response.extensions["tokenfuse"], fuse, 42)


def test_an_error_before_the_first_look_records_the_gathered_usage(
    lib: ModuleType, fuse: Fuse
) -> None:
    inner = Scripted(lib, GATHERED_NOT_LOOKED_AT, fail_with=lib.ReadError("connection reset"))
    with lib.Client(transport=FuseTransport(inner, fuse=fuse)) as client:
        response = client.send(client.build_request("POST", OPENAI_URL), stream=True)
        with pytest.raises(lib.ReadError, match="connection reset"):
            response.read()
    assert_partial(response.extensions["tokenfuse"], fuse, 42)


def test_an_error_midway_records_the_usage_seen_and_raises(lib: ModuleType, fuse: Fuse) -> None:
    inner = Scripted(lib, REPORTED_THEN_MORE, fail_with=lib.ReadError("connection reset"))
    with lib.Client(transport=FuseTransport(inner, fuse=fuse)) as client:
        response = client.send(client.build_request("POST", OPENAI_URL), stream=True)
        with pytest.raises(lib.ReadError, match="connection reset"):
            response.read()
    assert_partial(response.extensions["tokenfuse"], fuse, 42)


async def test_async_error_midway_records_the_usage_seen(lib: ModuleType, fuse: Fuse) -> None:
    inner = Scripted(lib, REPORTED_THEN_MORE, fail_with=lib.ReadError("connection reset"))
    async with lib.AsyncClient(transport=AsyncFuseTransport(inner, fuse=fuse)) as client:
        response = await client.send(client.build_request("POST", OPENAI_URL), stream=True)
        with pytest.raises(lib.ReadError, match="connection reset"):
            await response.aread()
        await response.aclose()
    assert_partial(response.extensions["tokenfuse"], fuse, 42)


@pytest.mark.parametrize("odd", ["text", 7, None], ids=["str", "int", "None"])
def test_a_chunk_that_is_not_bytes_is_passed_on_and_told(
    lib: ModuleType, fuse: Fuse, odd: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """It reaches the caller as it is and the stream flows on; its bytes cannot be read, so
    the usage the rest reported is recorded, marked partial, with one warning."""
    caplog.set_level(logging.WARNING, logger="tokenfuse")
    chunks: list[Any] = [TEXT_EVENT, odd, *up_to_a_border(), odd, USAGE_EVENT, DONE]
    inner = Scripted(lib, chunks)
    with lib.Client(transport=FuseTransport(inner, fuse=fuse)) as client:
        response = client.send(client.build_request("POST", OPENAI_URL), stream=True)
        passed = list(response.stream)  # the raw chunks, unchecked by the client
        response.close()
    assert passed == chunks
    assert_partial(response.extensions["tokenfuse"], fuse, 42)
    warnings = [r.getMessage() for r in caplog.records if "not bytes" in r.getMessage()]
    assert len(warnings) == 1 and type(odd).__name__ in warnings[0]
    assert "skipped" in (response.extensions["tokenfuse"].usage.problem or "")


class ShownBatches:
    """A meter whose stream reader keeps each batch it is shown, with the number of chunks
    the caller had been given by then."""

    def __init__(self, given: list[bytes]) -> None:
        self.given = given
        self.batches: list[tuple[int, bytes]] = []
        self.report = SimpleNamespace(done=False)

    def stream_reader(self) -> Any:
        return lambda data: self.batches.append((len(self.given), data))

    def skipped(self, problem: str) -> None:
        raise AssertionError(problem)

    def settle(self, meter: Any, complete: bool) -> None:
        assert meter is self and complete
        self.report.done = True

    async def asettle(self, meter: Any, complete: bool) -> None:
        self.settle(meter, complete)


SIZES = [1, 75, 999, BATCH + 1]


def chunks_of(size: int) -> list[bytes]:
    """A few batches of chunks of about ``size`` bytes, each of its own length and letter."""
    chunks = [bytes([65 + n % 26]) * (size + n % 3) for n in range(5 * GATHER + 7)]
    return chunks * max(1, 3 * BATCH // sum(map(len, chunks)))


def assert_batched(meter: ShownBatches, chunks: list[bytes], size: int) -> None:
    """Every byte shown once, in order; each batch but the last shown when a gather (every
    GATHER chunks) found BATCH bytes or more, and none bigger than that bound allows."""
    assert meter.given == chunks and meter.report.done
    assert b"".join(data for _, data in meter.batches) == b"".join(chunks)
    *inside, (_, last) = meter.batches
    assert len(inside) >= 2
    bound = BATCH + GATHER * (size + 2)  # less than BATCH bytes, then a gather's chunks
    for given_then, data in inside:
        assert given_then % GATHER == 0
        assert BATCH <= len(data) < bound
    assert len(last) < bound


@pytest.mark.parametrize("size", SIZES)
def test_a_batch_is_shown_once_a_gather_finds_batch_bytes(size: int) -> None:
    chunks, given = chunks_of(size), []
    meter = ShownBatches(given)
    for chunk in MeteredStream(iter(chunks), cast(Any, meter), meter.settle):
        assert chunk is chunks[len(given)]  # each chunk itself, at once
        given.append(chunk)
    assert_batched(meter, chunks, size)


@pytest.mark.parametrize("size", SIZES)
async def test_async_a_batch_is_shown_once_a_gather_finds_batch_bytes(size: int) -> None:
    chunks, given = chunks_of(size), []
    meter = ShownBatches(given)

    async def inner() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    stream = AsyncMeteredStream(cast(Any, inner()), cast(Any, meter), meter.asettle)
    async for chunk in stream:
        assert chunk is chunks[len(given)]
        given.append(chunk)
    assert_batched(meter, chunks, size)
