"""Against a real HTTP server on loopback: real sockets, chunked streams, gzip on the wire.

The transports are built with no arguments here: the clients' own HTTP transports underneath,
the process-wide embedded fuse on top (each test uses its own API key to stay apart).
"""

from __future__ import annotations

from types import ModuleType

import pytest

from tokenfuse import Identity, default_fuse
from tokenfuse._transport import AsyncFuseTransport, FuseReport, FuseTransport

from .llm_server import PROMPT_TOKENS, LLMServer, chat_events


def rate(api_key: str) -> float:
    return default_fuse().status(Identity.secret(api_key)).rate


@pytest.mark.parametrize("gzip", [True, False], ids=["gzip", "identity"])
def test_json_over_real_sockets(
    lib: ModuleType, llm_server: LLMServer, api_key: str, gzip: bool
) -> None:
    with lib.Client(transport=FuseTransport()) as client:
        response = client.post(
            llm_server.url,
            headers={"Authorization": f"Bearer {api_key}"},
            json={"tokens": 30, "gzip": gzip},
        )
    assert (response.headers.get("content-encoding") == "gzip") is gzip
    assert response.json()["usage"]["total_tokens"] == PROMPT_TOKENS + 30
    report: FuseReport = response.extensions["tokenfuse"]
    assert report.usage is not None
    assert report.usage.total == PROMPT_TOKENS + 30
    assert rate(api_key) == PROMPT_TOKENS + 30


@pytest.mark.parametrize("gzip", [True, False], ids=["gzip", "identity"])
def test_chunked_sse_stream_over_real_sockets(
    lib: ModuleType, llm_server: LLMServer, api_key: str, gzip: bool
) -> None:
    with (
        lib.Client(transport=FuseTransport()) as client,
        client.stream(
            "POST",
            llm_server.url,
            headers={"Authorization": f"Bearer {api_key}"},
            json={"stream": True, "chunks": 300, "gzip": gzip},
        ) as response,
    ):
        assert response.headers["transfer-encoding"] == "chunked"
        text = b"".join(response.iter_bytes())
    assert text == b"".join(chat_events(300))
    assert rate(api_key) == PROMPT_TOKENS + 300


async def test_async_clients_over_real_sockets(
    lib: ModuleType, llm_server: LLMServer, api_key: str
) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    async with lib.AsyncClient(transport=AsyncFuseTransport(), headers=headers) as client:
        await client.post(llm_server.url, json={"tokens": 5})
        async with client.stream("POST", llm_server.url, json={"stream": True, "chunks": 50}) as r:
            async for _ in r.aiter_bytes():
                pass
    assert rate(api_key) == (PROMPT_TOKENS + 5) + (PROMPT_TOKENS + 50)


@pytest.mark.parametrize("gzip", [True, False], ids=["gzip", "identity"])
def test_a_chunk_passes_while_the_server_is_paused(
    lib: ModuleType, llm_server: LLMServer, api_key: str, gzip: bool
) -> None:
    llm_server.release.clear()
    with (
        lib.Client(transport=FuseTransport()) as client,
        client.stream(
            "POST",
            llm_server.url,
            headers={"Authorization": f"Bearer {api_key}"},
            json={"stream": True, "chunks": 5, "pause": True, "gzip": gzip},
        ) as response,
    ):
        chunks = response.iter_bytes()
        first = next(chunks)  # arrives while the server waits, or this blocks
        llm_server.release.set()
        rest = b"".join(chunks)
    assert llm_server.released_in_time[-1]  # released by us, not by the server's timeout
    assert first.startswith(b"data: ")
    assert first + rest == b"".join(chat_events(5))
    assert rate(api_key) == PROMPT_TOKENS + 5


async def test_async_chunk_passes_while_the_server_is_paused(
    lib: ModuleType, llm_server: LLMServer, api_key: str
) -> None:
    llm_server.release.clear()
    headers = {"Authorization": f"Bearer {api_key}"}
    async with (
        lib.AsyncClient(transport=AsyncFuseTransport(), headers=headers) as client,
        client.stream(
            "POST", llm_server.url, json={"stream": True, "chunks": 5, "pause": True}
        ) as response,
    ):
        chunks = response.aiter_bytes()
        first = await chunks.__anext__()
        llm_server.release.set()
        rest = b"".join([chunk async for chunk in chunks])
    assert llm_server.released_in_time[-1]
    assert first + rest == b"".join(chat_events(5))
    assert rate(api_key) == PROMPT_TOKENS + 5
