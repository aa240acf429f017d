"""Asking OpenAI-style streams for their usage: which requests, what is sent, strict servers."""

from __future__ import annotations

import gzip
import json
import logging
import uuid
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from tokenfuse import Fuse
from tokenfuse._transport import AsyncFuseTransport, FuseReport, FuseTransport, usage_option

from .bodies import CASES, JSON
from .conftest import chunk_stream, split
from .llm_server import STRICT_ERROR, LLMServer

STREAM = CASES["openai-chat-stream"]  # reports 25 tokens when asked
MESSAGES = [{"role": "user", "content": "Say hello"}]
OPTION = b',"stream_options":{"include_usage":true}'


def streaming_body(**extra: object) -> bytes:
    return json.dumps(
        {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True, **extra}
    ).encode()


class Recorder:
    """An inner transport's handler: keeps each request (body read) and answers the stream."""

    def __init__(self, lib: ModuleType) -> None:
        self.lib = lib
        self.requests: list[Any] = []

    def __call__(self, request: Any) -> Any:
        request.read()
        self.requests.append(request)
        stream = chunk_stream(self.lib, split(STREAM.body, "random"))
        return self.lib.Response(200, headers={"content-type": STREAM.content_type}, stream=stream)


@pytest.fixture(autouse=True)
def no_refusing_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with no host remembered as refusing the option."""
    monkeypatch.setattr(usage_option, "_refusing", {})


def test_a_stream_that_does_not_ask_for_usage_is_asked(lib: ModuleType, fuse: Fuse) -> None:
    recorder = Recorder(lib)
    body = streaming_body()
    headers = {**STREAM.request_headers, "X-Trace": "t-1", "Content-Type": "application/json"}
    with lib.Client(transport=FuseTransport(lib.MockTransport(recorder), fuse=fuse)) as client:
        response = client.post(STREAM.url, headers=headers, content=body)
    sent = recorder.requests[0]
    assert sent.content == body[:-1] + OPTION + b"}"
    assert sent.headers["content-length"] == str(len(sent.content))
    assert sent.headers["x-trace"] == "t-1"
    assert sent.headers["authorization"] == STREAM.request_headers["Authorization"]
    assert response.request.content == body  # the caller's request is not changed
    report: FuseReport = response.extensions["tokenfuse"]
    assert report.asked_usage
    assert report.usage is not None
    assert report.usage.total == STREAM.total
    assert not report.usage.estimated
    assert fuse.stats.usage_asked == 1


async def test_async_streams_are_asked_too(lib: ModuleType, fuse: Fuse) -> None:
    recorder = Recorder(lib)
    transport = AsyncFuseTransport(lib.MockTransport(recorder), fuse=fuse)
    async with lib.AsyncClient(transport=transport) as client:
        response = await client.post(STREAM.url, content=streaming_body())
    assert recorder.requests[0].content.endswith(OPTION + b"}")
    assert response.extensions["tokenfuse"].usage.total == STREAM.total


def _streamed_body() -> Iterator[bytes]:
    yield streaming_body()


LEFT_ALONE = [
    pytest.param(STREAM.url, json.dumps({"messages": MESSAGES}).encode(), {}, id="not-a-stream"),
    pytest.param(
        STREAM.url, streaming_body(stream_options={"include_usage": True}), {}, id="asks-already"
    ),
    pytest.param("https://api.openai.com/v1/responses", streaming_body(), {}, id="responses"),
    pytest.param("https://api.anthropic.com/v1/messages", streaming_body(), {}, id="anthropic"),
    pytest.param(
        "https://api.groq.com/openai/v1/chat/completions", streaming_body(), {}, id="groq"
    ),
    pytest.param(STREAM.url, streaming_body(), {"inject_usage": False}, id="inject_usage=False"),
    pytest.param(STREAM.url, gzip.compress(streaming_body()), {}, id="compressed-request"),
]


@pytest.mark.parametrize(("url", "body", "options"), LEFT_ALONE)
def test_requests_that_are_sent_as_they_were_made(
    lib: ModuleType, fuse: Fuse, url: str, body: bytes, options: dict[str, bool]
) -> None:
    recorder = Recorder(lib)
    headers = {"Content-Encoding": "gzip"} if body[:2] == b"\x1f\x8b" else {}
    transport = FuseTransport(lib.MockTransport(recorder), fuse=fuse, **options)
    with lib.Client(transport=transport) as client:
        response = client.post(url, content=body, headers=headers)
    assert recorder.requests[0].content == body
    assert not response.extensions["tokenfuse"].asked_usage
    assert fuse.stats.usage_asked == 0


def test_a_streamed_request_body_is_sent_as_it_is(lib: ModuleType, fuse: Fuse) -> None:
    recorder = Recorder(lib)
    with lib.Client(transport=FuseTransport(lib.MockTransport(recorder), fuse=fuse)) as client:
        client.post(STREAM.url, content=_streamed_body())
    assert recorder.requests[0].content == streaming_body()
    assert fuse.stats.usage_asked == 0


# -- servers that refuse the option -------------------------------------------------------------


@pytest.fixture(scope="module")
def strict_server() -> Iterator[LLMServer]:
    with LLMServer(strict=True) as running:
        yield running


def stream_once(client: Any, server: LLMServer) -> tuple[bytes, FuseReport]:
    with client.stream("POST", server.url, content=streaming_body(chunks=6)) as response:
        assert response.status_code == 200
        text = b"".join(response.iter_bytes())
    return text, response.extensions["tokenfuse"]


def test_a_strict_server_gets_the_request_again_once_and_is_not_asked_again(
    lib: ModuleType, strict_server: LLMServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tokenfuse")
    fuse = Fuse()
    headers = {"Authorization": f"Bearer sk-strict-{uuid.uuid4().hex}"}
    before = len(strict_server.bodies)
    with lib.Client(transport=FuseTransport(fuse=fuse), headers=headers) as client:
        text, first = stream_once(client, strict_server)
        sent = strict_server.bodies[before:]
        _, second = stream_once(client, strict_server)
    assert [b"stream_options" in body for body in sent] == [True, False]
    assert sent[1] == streaming_body(chunks=6)  # resent exactly as it was made
    assert len(strict_server.bodies) == before + 3  # the second call was not asked
    assert text.count(b"data: ") == 6 + 1  # the stream the caller asked for: no usage chunk
    for report in (first, second):
        assert not report.asked_usage
        assert report.usage is not None
        assert report.usage.estimated  # counted all the same
        streamed = "".join(f"tok{n} " for n in range(6))
        assert report.usage.output == -(-len(streamed) // 4)  # 4 bytes a token, rounded up
    assert fuse.stats.usage_asked == 1
    assert fuse.stats.usage_option_refused == 1
    refusals = [
        r.getMessage() for r in caplog.records if "refused stream_options" in r.getMessage()
    ]
    assert len(refusals) == 1
    assert f"127.0.0.1:{strict_server.port}" in refusals[0]


async def test_async_strict_server(lib: ModuleType) -> None:
    server = LLMServer(strict=True)
    fuse = Fuse()
    with server:
        async with (
            lib.AsyncClient(transport=AsyncFuseTransport(fuse=fuse)) as client,
            client.stream("POST", server.url, content=streaming_body()) as response,
        ):
            assert response.status_code == 200
            await response.aread()
    assert [b"stream_options" in body for body in server.bodies] == [True, False]
    assert fuse.stats.usage_option_refused == 1
    assert response.extensions["tokenfuse"].usage.estimated


class ErrorServer:
    """Answers every request with a big gzip-compressed 400 in many chunks."""

    def __init__(self, lib: ModuleType, message: bytes) -> None:
        self.lib = lib
        self.body = json.dumps(
            {"error": {"message": message.decode(), "pad": "x" * 40_000}}
        ).encode()
        self.requests = 0

    def __call__(self, request: Any) -> Any:
        self.requests += 1
        chunks = split(gzip.compress(self.body), "bytes")
        headers = {"content-type": JSON, "content-encoding": "gzip"}
        return self.lib.Response(400, headers=headers, stream=chunk_stream(self.lib, chunks))


def test_another_400_reaches_the_caller_whole_and_is_not_resent(
    lib: ModuleType, fuse: Fuse
) -> None:
    server = ErrorServer(lib, b"model not found")
    with lib.Client(transport=FuseTransport(lib.MockTransport(server), fuse=fuse)) as client:
        first = client.post(STREAM.url, content=streaming_body())
        client.post(STREAM.url, content=streaming_body())
    assert first.status_code == 400
    assert first.content == server.body
    assert server.requests == 2  # not resent
    assert fuse.stats.usage_asked == 2  # the host is still asked
    assert fuse.stats.usage_option_refused == 0


async def test_another_400_reaches_an_async_caller_whole(lib: ModuleType, fuse: Fuse) -> None:
    server = ErrorServer(lib, b"model not found")
    transport = AsyncFuseTransport(lib.MockTransport(server), fuse=fuse)
    async with lib.AsyncClient(transport=transport) as client:
        response = await client.post(STREAM.url, content=streaming_body())
    assert response.content == server.body
    assert server.requests == 1


def test_the_refusing_hosts_remembered_are_bounded(
    lib: ModuleType, fuse: Fuse, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(usage_option, "MAX_HOSTS", 2)
    refusing = STRICT_ERROR["error"]["message"].encode()
    hosts = ["a.example", "b.example", "c.example"]
    asked: list[str] = []

    def strict(request: Any) -> Any:
        request.read()
        if b"stream_options" in request.content:
            asked.append(request.url.host)
            return lib.Response(400, json={"error": {"message": refusing.decode()}})
        return lib.Response(200, headers={"content-type": STREAM.content_type}, content=b"")

    with lib.Client(transport=FuseTransport(lib.MockTransport(strict), fuse=fuse)) as client:
        for host in [*hosts, "a.example", "c.example"]:
            client.post(f"https://{host}/v1/chat/completions", content=streaming_body())
    assert len(usage_option._refusing) == 2
    assert asked == [*hosts, "a.example"]  # a.example was forgotten, c.example was not
