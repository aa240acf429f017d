"""Google's Gen AI SDK, guarded with ``guard_genai``: its automatic function calling is the loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from google import genai
from google.genai import types

from tokenfuse import CeilingExceeded, ConfigurationError, Fuse, FuseTransport
from tokenfuse.integrations.genai import guard_genai

from .conftest import UNTIL_TRIP
from .stub import AgentServer


def lookup(query: str = "") -> str:
    """Look something up (the stub model asks for it forever)."""
    return "nothing found, try again"


#: The SDK calls the tool and asks again by itself, up to this many times (its default is 10).
CONFIG = types.GenerateContentConfig(
    tools=[lookup],
    automatic_function_calling=types.AutomaticFunctionCallingConfig(maximum_remote_calls=20),
)


@pytest.fixture
def client(server: AgentServer, fuse: Fuse, api_key: str) -> Iterator[genai.Client]:
    guarded = genai.Client(
        api_key=api_key, http_options=guard_genai({"base_url": server.base}, fuse=fuse)
    )
    yield guarded
    guarded.close()


@pytest.fixture
async def aclient(client: genai.Client) -> AsyncIterator[genai.Client]:
    yield client
    await client.aio.aclose()


def test_function_calling_loop_is_stopped(
    client: genai.Client, server: AgentServer, api_key: str
) -> None:
    with pytest.raises(CeilingExceeded):
        client.models.generate_content(model="gemini-stub", contents="find it", config=CONFIG)
    assert server.count(api_key) == UNTIL_TRIP


def test_streamed_loop_is_stopped(client: genai.Client, server: AgentServer, api_key: str) -> None:
    def stream_again_and_again() -> None:
        for _ in range(UNTIL_TRIP + 1):
            for _ in client.models.generate_content_stream(model="gemini-stub", contents="find it"):
                pass

    with pytest.raises(CeilingExceeded):
        stream_again_and_again()
    assert server.count(api_key) == UNTIL_TRIP
    assert all(hit.stream for hit in server.hits if hit.credential == api_key)


async def test_async_function_calling_loop_is_stopped(
    aclient: genai.Client, server: AgentServer, api_key: str
) -> None:
    with pytest.raises(CeilingExceeded):
        await aclient.aio.models.generate_content(
            model="gemini-stub", contents="find it", config=CONFIG
        )
    assert server.count(api_key) == UNTIL_TRIP


async def test_async_stream_loop_is_stopped(
    aclient: genai.Client, server: AgentServer, api_key: str
) -> None:
    async def stream_again_and_again() -> None:
        for _ in range(UNTIL_TRIP + 1):
            stream = await aclient.aio.models.generate_content_stream(
                model="gemini-stub", contents="find it"
            )
            async for _ in stream:
                pass

    with pytest.raises(CeilingExceeded):
        await stream_again_and_again()
    assert server.count(api_key) == UNTIL_TRIP


def test_the_given_options_are_kept_and_not_changed() -> None:
    given = types.HttpOptions(base_url="http://127.0.0.1:9", timeout=5_000)
    guarded = guard_genai(given)
    assert (guarded.base_url, guarded.timeout) == ("http://127.0.0.1:9", 5_000)
    assert given.client_args is None
    assert isinstance(guarded.client_args["transport"], FuseTransport)


def test_a_client_built_by_the_application_is_refused_clearly() -> None:
    import httpx

    with httpx.Client() as own, pytest.raises(ConfigurationError, match="httpx_client"):
        guard_genai(types.HttpOptions(httpx_client=own))
