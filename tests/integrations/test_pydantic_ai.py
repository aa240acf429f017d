"""Pydantic AI agents on OpenAI, Anthropic and Google models, guarded with ``guard_pydantic_ai``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.google import GoogleModel
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.google import GoogleProvider
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

from tokenfuse import AsyncFuseTransport, CeilingExceeded, ConfigurationError, Fuse
from tokenfuse.integrations.pydantic_ai import guard_pydantic_ai

from .conftest import UNTIL_TRIP
from .stub import AgentServer

#: Far above the requests tokenfuse lets through (Pydantic AI's own default limit is 50).
LIMITS = UsageLimits(request_limit=20)


def openai_chat(server: AgentServer, api_key: str) -> Any:
    return OpenAIChatModel("stub", provider=OpenAIProvider(f"{server.base}/v1", api_key))


def openai_responses(server: AgentServer, api_key: str) -> Any:
    return OpenAIResponsesModel("stub", provider=OpenAIProvider(f"{server.base}/v1", api_key))


def anthropic(server: AgentServer, api_key: str) -> Any:
    return AnthropicModel(
        "claude-stub", provider=AnthropicProvider(api_key=api_key, base_url=server.base)
    )


def google(server: AgentServer, api_key: str) -> Any:
    return GoogleModel(
        "gemini-stub", provider=GoogleProvider(api_key=api_key, base_url=server.base)
    )


MODELS = [
    pytest.param(openai_chat, id="openai-chat"),
    pytest.param(openai_responses, id="openai-responses"),
    pytest.param(anthropic, id="anthropic"),
    pytest.param(google, id="google"),
]


def runaway_agent(model: Any) -> Agent[None, str]:
    agent = Agent(model, instructions="Find it.")

    @agent.tool_plain
    def lookup(query: str = "") -> str:
        """Look something up (the stub model asks for it forever)."""
        return "nothing found, try again"

    return agent


@pytest.mark.parametrize("make", MODELS)
async def test_agent_loop_is_stopped(
    server: AgentServer, fuse: Fuse, api_key: str, make: Callable[..., Any]
) -> None:
    agent = runaway_agent(guard_pydantic_ai(make(server, api_key), fuse=fuse))
    async with agent:
        with pytest.raises(CeilingExceeded):
            await agent.run("find it", usage_limits=LIMITS)
    assert server.count(api_key) == UNTIL_TRIP


@pytest.mark.parametrize("make", MODELS)
async def test_streamed_agent_loop_is_stopped(
    server: AgentServer, fuse: Fuse, api_key: str, make: Callable[..., Any]
) -> None:
    agent = runaway_agent(guard_pydantic_ai(make(server, api_key), fuse=fuse))

    async def run_streaming() -> None:
        async with agent.iter("find it", usage_limits=LIMITS) as run:
            async for node in run:
                if Agent.is_model_request_node(node):
                    async with node.stream(run.ctx) as events:
                        async for _ in events:
                            pass

    async with agent:
        with pytest.raises(CeilingExceeded):
            await run_streaming()
    assert server.count(api_key) == UNTIL_TRIP
    assert all(hit.stream for hit in server.hits if hit.credential == api_key)


def test_clients_made_for_new_event_loops_are_guarded(
    server: AgentServer, fuse: Fuse, api_key: str
) -> None:
    # Each asyncio.run has a loop of its own: the provider closes its client when the agent is
    # left and makes a new one for the next loop, from the guarded factory.
    provider = guard_pydantic_ai(OpenAIProvider(f"{server.base}/v1", api_key), fuse=fuse)
    agent = Agent(OpenAIChatModel("stub", provider=provider))  # no tools: one request a run

    async def run_once() -> None:
        async with agent:
            await agent.run("say ok")

    def run_on_new_loops() -> None:
        for _ in range(UNTIL_TRIP + 1):
            asyncio.run(run_once())

    with pytest.raises(CeilingExceeded):
        run_on_new_loops()
    assert server.count(api_key) == UNTIL_TRIP


def test_a_provider_given_its_client_is_refused_clearly(server: AgentServer, fuse: Fuse) -> None:
    import httpx2

    own = httpx2.AsyncClient(transport=AsyncFuseTransport(fuse=fuse))
    provider = OpenAIProvider(f"{server.base}/v1", "sk-own", http_client=own)
    with pytest.raises(ConfigurationError, match="build that client with transport="):
        guard_pydantic_ai(provider, fuse=fuse)
