"""Bad input never breaks the user's call: the client gets the bytes, the usage reads unknown,
and the problem is logged once."""

from __future__ import annotations

import gzip
import logging
from types import ModuleType
from typing import Any

import pytest

from tokenfuse import Fuse
from tokenfuse._transport import AsyncFuseTransport, FuseTransport, meter
from tokenfuse._usage import ExtractorRegistry, ResponseInfo, Usage

from .bodies import CASES, JSON, SSE, Case, dumps, sse
from .conftest import ChunkServer

CHAT_URL = CASES["openai-chat"].url
ANTHROPIC_URL = CASES["anthropic-messages"].url


def usage_body(usage: object) -> bytes:
    return dumps({"id": "chatcmpl-1", "object": "chat.completion", "choices": [], "usage": usage})


BAD = [
    pytest.param(Case(CHAT_URL, JSON, b'{"id": "x", "usage": {"total_tokens": 2', None),
                 id="malformed-json"),
    pytest.param(Case(CHAT_URL, JSON, b"\x00\xff" * 500, None), id="binary-garbage"),
    pytest.param(Case(CHAT_URL, JSON, usage_body({"total_tokens": "25"}), None),
                 id="count-as-string"),
    pytest.param(Case(CHAT_URL, JSON, usage_body({"total_tokens": -25}), None),
                 id="negative-count"),
    pytest.param(Case(CHAT_URL, JSON, usage_body({"total_tokens": 1e300}), None),
                 id="absurd-count"),
    pytest.param(Case(CHAT_URL, JSON, usage_body({"total_tokens": None}), None),
                 id="null-count"),
    pytest.param(Case(CHAT_URL, JSON, b'{"usage": {"total_tokens": NaN}}', None), id="nan"),
    pytest.param(Case(CHAT_URL, JSON, b"[" * 100_000 + b"]" * 100_000, None),
                 id="deeply-nested"),
    pytest.param(Case(ANTHROPIC_URL, SSE, CASES["anthropic-stream"].body[:-40], 40),
                 id="truncated-sse-after-usage"),
    pytest.param(Case(ANTHROPIC_URL, SSE, b"event: message_start\ndata: {\"type\": \"mess", None),
                 id="truncated-sse-mid-event"),
    pytest.param(
        Case(ANTHROPIC_URL, SSE,
             b"data: not json\n\n: comment\n\ngarbage line without colon\n\n"
             + CASES["anthropic-stream"].body + b"data: {\"broken\n\n", 40),
        id="sse-with-garbage-around-events"),
    pytest.param(
        Case(CHAT_URL, SSE,
             sse((None, {"usage": {"prompt_tokens": 1, "completion_tokens": 2}}))
             + b"data: {\"choices\": [], \"usage\": {\"total_tokens\": \"many\"}}\n\n"
             + b"\r\n\r\n\n\r" * 50 + b"data: [DONE]\n\n", None),
        id="sse-bad-update-after-good-usage"),  # a count that went bad is not a count
]  # fmt: skip


def check_survived(case: Case, response: Any, fuse: Fuse) -> None:
    assert response.content == case.body  # the call is intact
    report = response.extensions["tokenfuse"]
    assert report.done
    rate = fuse.status(report.identity).rate
    if case.total is None:
        assert report.usage is not None
        assert report.usage.total is None
        assert report.usage.problem
        assert rate == 0
    else:
        assert report.usage.total == case.total
        assert rate == case.total


@pytest.mark.parametrize("how", ["read", "bytes"])
@pytest.mark.parametrize("case", BAD)
def test_bad_bodies_read_as_unknown(lib: ModuleType, fuse: Fuse, case: Case, how: str) -> None:
    if how == "bytes" and len(case.body) > 10_000:
        how = "random"
    server = ChunkServer(lib, case, how=how, already_read=how == "read")
    with lib.Client(transport=FuseTransport(server.transport(), fuse=fuse)) as client:
        response = client.post(case.url)
    check_survived(case, response, fuse)


@pytest.mark.parametrize("case", BAD[:3])
async def test_async_bad_bodies(lib: ModuleType, fuse: Fuse, case: Case) -> None:
    server = ChunkServer(lib, case, how="random")
    async with lib.AsyncClient(transport=AsyncFuseTransport(server.transport(), fuse=fuse)) as c:
        response = await c.post(case.url)
    check_survived(case, response, fuse)


def test_a_huge_body_is_never_buffered_whole_and_still_counted(lib: ModuleType, fuse: Fuse) -> None:
    vectors = [{"object": "embedding", "index": i, "embedding": "A" * 4096} for i in range(4096)]
    body = dumps(
        {"object": "list", "data": vectors, "usage": {"prompt_tokens": 9, "total_tokens": 9}}
    )
    assert len(body) > 16 * 1024 * 1024
    case = Case(CASES["openai-embeddings"].url, JSON, body, 9)
    server = ChunkServer(lib, case, encoding="gzip", how="random")
    with lib.Client(transport=FuseTransport(server.transport(), fuse=fuse)) as client:
        response = client.post(case.url)
    check_survived(case, response, fuse)


@pytest.mark.parametrize("encoding", ["x-unknown", "gzip, br, zstd, deflate, gzip"])
def test_unknown_or_absurd_encodings(lib: ModuleType, fuse: Fuse, encoding: str) -> None:
    body = CASES["openai-chat"].body

    def handler(request: Any) -> Any:
        headers = {"content-type": JSON, "content-encoding": encoding}
        return lib.Response(200, headers=headers, stream=lib.ByteStream(body))

    with lib.Client(transport=FuseTransport(lib.MockTransport(handler), fuse=fuse)) as client:
        response = client.send(client.build_request("POST", CHAT_URL), stream=True)
        raw = b"".join(response.iter_raw())  # the raw bytes pass untouched
    assert raw == body
    report = response.extensions["tokenfuse"]
    assert report.usage.total is None
    assert report.record is None


def test_a_corrupt_gzip_stream_is_unknown_and_passes_through(lib: ModuleType, fuse: Fuse) -> None:
    compressed = gzip.compress(CASES["openai-chat"].body)
    corrupt = compressed[:20] + bytes(b ^ 0x55 for b in compressed[20:40]) + compressed[40:]

    def handler(request: Any) -> Any:
        headers = {"content-type": JSON, "content-encoding": "gzip"}
        return lib.Response(200, headers=headers, stream=lib.ByteStream(corrupt))

    with lib.Client(transport=FuseTransport(lib.MockTransport(handler), fuse=fuse)) as client:
        response = client.send(client.build_request("POST", CHAT_URL), stream=True)
        assert b"".join(response.iter_raw()) == corrupt
        response.close()
    assert response.extensions["tokenfuse"].usage.total is None


class Broken:
    """A custom extractor that fails in the step named ``where``."""

    def __init__(self, where: str) -> None:
        self.where = where

    def reader_for(self, info: ResponseInfo) -> Any:
        if self.where == "reader_for":
            raise RuntimeError("extractor bug")
        return self

    def feed(self, chunk: bytes) -> None:
        if self.where == "feed":
            raise RuntimeError("feed bug")

    def finish(self, *, complete: bool) -> Usage:
        if self.where == "finish":
            raise RuntimeError("finish bug")
        return Usage(total=7.0, provider="custom")


class BrokenRegistry:
    """A registry (not ours) whose reader_for itself raises."""

    def reader_for(self, **kwargs: Any) -> Any:
        raise RuntimeError("registry bug")


@pytest.mark.parametrize("where", ["reader_for", "feed", "finish", "registry"])
def test_a_failing_extractor_is_contained_and_logged_once(
    lib: ModuleType, fuse: Fuse, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    meter._failures_logged.clear()
    caplog.set_level(logging.WARNING, logger="tokenfuse")
    registry: Any
    if where == "registry":
        registry = BrokenRegistry()
    else:
        registry = ExtractorRegistry()
        registry.register(Broken(where))
    case = CASES["openai-chat-stream"]
    server = ChunkServer(lib, case, how="random")
    transport = FuseTransport(server.transport(), fuse=fuse, registry=registry)
    with lib.Client(transport=transport) as client:
        responses = [client.post(case.url) for _ in range(3)]
    for response in responses:
        assert response.content == case.body
        usage = response.extensions["tokenfuse"].usage
        if where == "reader_for":  # a failing custom extractor: the built-ins take over
            assert usage.total == case.total
        else:
            assert usage.total is None
            assert "failed" in (usage.problem or "")
    logged = [r.getMessage() for r in caplog.records if r.name == "tokenfuse"]
    if where == "reader_for":
        assert logged == []
        return
    # The three unknown calls are counted, and reported once (not once per call).
    assert fuse.stats.usage.unknown == 3
    assert [m for m in logged if m.startswith("usage_unknown")] == [logged[-1]]
    assert "(1 so far, 1 since the last report)" in logged[-1]  # the first, at once
    if where == "registry":  # the registry's own failure is logged with its traceback, once
        assert len(logged) == 2
        assert caplog.records[0].exc_info is not None
    else:
        assert len(logged) == 1
