"""Streams that did not ask for usage, through the real openai SDK and langchain-openai.

The transport asks them for their usage (``stream_options.include_usage``), so they are counted
exactly; the caller still gets the stream its SDK expects, which now ends with the usage chunk
(empty ``choices``). Against the stub server on real sockets, which, like OpenAI, reports stream
usage only when asked.
"""

from __future__ import annotations

import json

import httpx2
import openai
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI

from tokenfuse import Fuse
from tokenfuse._transport import AsyncFuseTransport, FuseTransport
from tokenfuse.fuse import Identity, UsageCounts

from .llm_server import LLMServer

MESSAGES = [{"role": "user", "content": "Say hello to the world"}]
CHUNKS = 12
TEXT = "".join(f"tok{n} " for n in range(CHUNKS))


def base_url(llm_server: LLMServer) -> str:
    return llm_server.url.removesuffix("/chat/completions")


def assert_counted_exactly(fuse: Fuse, llm_server: LLMServer, api_key: str, calls: int) -> None:
    """Every call asked for its usage, and the fuse holds what the server billed."""
    bodies = llm_server.bodies[-calls:]
    assert all(json.loads(body)["stream_options"] == {"include_usage": True} for body in bodies)
    assert fuse.status(Identity.secret(api_key)).rate == sum(llm_server.billed[-calls:])
    assert fuse.stats.usage_asked == calls
    assert fuse.stats.usage == UsageCounts()  # nothing estimated, unknown or partial


def test_openai_stream_without_stream_options(llm_server: LLMServer, api_key: str) -> None:
    fuse = Fuse()
    with httpx2.Client(transport=FuseTransport(fuse=fuse)) as http_client:
        client = openai.OpenAI(
            api_key=api_key, base_url=base_url(llm_server), http_client=http_client
        )
        stream = client.chat.completions.create(
            model="stub",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            extra_body={"chunks": CHUNKS},
        )
        chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TEXT
    assert [bool(c.choices) for c in chunks] == [True] * CHUNKS + [False]  # one more chunk
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == CHUNKS
    assert_counted_exactly(fuse, llm_server, api_key, 1)


async def test_async_openai_stream_without_stream_options(
    llm_server: LLMServer, api_key: str
) -> None:
    fuse = Fuse()
    async with httpx2.AsyncClient(transport=AsyncFuseTransport(fuse=fuse)) as http_client:
        client = openai.AsyncOpenAI(
            api_key=api_key, base_url=base_url(llm_server), http_client=http_client
        )
        stream = await client.chat.completions.create(
            model="stub",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            extra_body={"chunks": CHUNKS},
        )
        text = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        reply = await client.chat.completions.create(model="stub", messages=MESSAGES)  # type: ignore[arg-type]
    assert "".join(text) == TEXT
    assert reply.usage is not None  # a call that is not a stream is sent as it was made
    assert b"stream_options" not in llm_server.bodies[-1]
    assert fuse.status(Identity.secret(api_key)).rate == sum(llm_server.billed[-2:])
    assert fuse.stats.usage_asked == 1


def langchain_model(llm_server: LLMServer, api_key: str, **clients: object) -> ChatOpenAI:
    """As users write it: their own http clients, which turns LangChain's stream_usage off."""
    model = ChatOpenAI(
        model="stub",
        api_key=api_key,  # type: ignore[arg-type]
        base_url=base_url(llm_server),
        streaming=True,
        extra_body={"chunks": CHUNKS},
        **clients,  # type: ignore[arg-type]
    )
    assert not model.stream_usage  # what made these streams uncounted before
    return model


def joined(parts: list[AIMessageChunk]) -> AIMessageChunk:
    whole = parts[0]
    for part in parts[1:]:
        whole = whole + part
    return whole


def test_langchain_streaming_with_http_client(llm_server: LLMServer, api_key: str) -> None:
    fuse = Fuse()
    with httpx2.Client(transport=FuseTransport(fuse=fuse)) as http_client:
        model = langchain_model(llm_server, api_key, http_client=http_client)
        answer = model.invoke("Say hello to the world")
        parts = list(model.stream("Say hello again"))
    assert answer.content == TEXT
    whole = joined(parts)
    assert whole.content == TEXT
    assert whole.usage_metadata is not None
    assert whole.usage_metadata["output_tokens"] == CHUNKS  # LangChain read the usage chunk
    assert_counted_exactly(fuse, llm_server, api_key, 2)


async def test_async_langchain_streaming_with_http_client(
    llm_server: LLMServer, api_key: str
) -> None:
    fuse = Fuse()
    async with httpx2.AsyncClient(transport=AsyncFuseTransport(fuse=fuse)) as http_async_client:
        model = langchain_model(llm_server, api_key, http_async_client=http_async_client)
        answer = await model.ainvoke("Say hello to the world")
        parts = [part async for part in model.astream("Say hello again")]
    assert answer.content == joined(parts).content == TEXT
    assert_counted_exactly(fuse, llm_server, api_key, 2)
