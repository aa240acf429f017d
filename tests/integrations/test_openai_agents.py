"""The OpenAI Agents SDK, guarded with ``guard_openai_agents``: Responses and Chat Completions,
plain and streamed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)

from tokenfuse import CeilingExceeded, Fuse
from tokenfuse.integrations.openai_agents import guard_openai_agents

from .conftest import UNTIL_TRIP
from .stub import AgentServer

#: Far above the turns tokenfuse lets through (the SDK's own default is 10).
MAX_TURNS = 50


@function_tool
def lookup(query: str = "") -> str:
    """Look something up (the stub model asks for it forever)."""
    return "nothing found, try again"


AGENT = Agent(name="runaway", instructions="Find it.", model="stub", tools=[lookup])


@pytest.fixture(autouse=True)
def no_tracing() -> Iterator[None]:
    set_tracing_disabled(True)  # traces would be uploaded to the internet
    yield
    set_tracing_disabled(False)


@pytest.fixture(params=["responses", "chat_completions"])
async def api(
    request: pytest.FixtureRequest, server: AgentServer, fuse: Fuse, api_key: str
) -> AsyncIterator[str]:
    """The SDK on the stub through a guarded default client, with one of its two model APIs."""
    base = openai.AsyncOpenAI(base_url=f"{server.base}/v1", api_key=api_key, max_retries=0)
    guarded = guard_openai_agents(base, fuse=fuse, use_for_tracing=False)
    set_default_openai_api(request.param)
    yield request.param
    set_default_openai_api("responses")
    set_default_openai_client(None, use_for_tracing=False)  # type: ignore[arg-type]
    await guarded.close()
    await base.close()


async def test_agent_loop_is_stopped(api: str, server: AgentServer, api_key: str) -> None:
    with pytest.raises(CeilingExceeded):
        await Runner.run(AGENT, "find it", max_turns=MAX_TURNS)
    assert server.count(api_key) == UNTIL_TRIP


async def test_streamed_agent_loop_is_stopped(api: str, server: AgentServer, api_key: str) -> None:
    # Chat Completions streams to a server that is not OpenAI's carry usage only when asked.
    agent = AGENT.clone(model_settings=ModelSettings(include_usage=True))
    result = Runner.run_streamed(agent, "find it", max_turns=MAX_TURNS)
    with pytest.raises(CeilingExceeded):
        async for _ in result.stream_events():
            pass
    assert server.count(api_key) == UNTIL_TRIP
    assert all(hit.stream for hit in server.hits if hit.credential == api_key)


@pytest.mark.parametrize("api", ["chat_completions"], indirect=True)
async def test_chat_completions_stream_is_counted_without_settings(
    api: str, server: AgentServer, api_key: str
) -> None:
    # The SDK asks for usage only on OpenAI's own URL; FuseTransport asks for it everywhere.
    result = Runner.run_streamed(AGENT, "find it", max_turns=MAX_TURNS)
    with pytest.raises(CeilingExceeded):
        async for _ in result.stream_events():
            pass
    assert server.count(api_key) == UNTIL_TRIP
