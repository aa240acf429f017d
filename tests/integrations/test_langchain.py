"""LangChain chat models and LangGraph agents, guarded with ``guard_langchain``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_anthropic import ChatAnthropic
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

from tokenfuse import CeilingExceeded, ConfigurationError, Fuse
from tokenfuse.integrations.langchain import guard_langchain

from .conftest import UNTIL_TRIP
from .stub import AgentServer

#: A bound on each test agent, far above the calls tokenfuse lets through (LangGraph's own
#: default is 10,007 steps, two per model call).
LIMIT: Any = {"recursion_limit": 100}
QUESTION: Any = {"messages": [("user", "find it")]}


@tool
def lookup(query: str = "") -> str:
    """Look something up (the stub model asks for it forever)."""
    return "nothing found, try again"


@pytest.fixture
def chat_openai(server: AgentServer, fuse: Fuse, api_key: str) -> Iterator[ChatOpenAI]:
    """A guarded ``ChatOpenAI`` on the stub; its sync client is closed after the test."""
    llm = ChatOpenAI(model="stub", base_url=f"{server.base}/v1", api_key=api_key, max_retries=0)
    guarded = guard_langchain(llm, fuse=fuse)
    yield guarded
    guarded.root_client.close()


@pytest.fixture
async def achat_openai(chat_openai: ChatOpenAI) -> AsyncIterator[ChatOpenAI]:
    """The same model for async tests: its async client is closed on the test's event loop."""
    yield chat_openai
    await chat_openai.root_async_client.close()


@pytest.fixture
def chat_anthropic(server: AgentServer, fuse: Fuse, api_key: str) -> Iterator[ChatAnthropic]:
    llm = ChatAnthropic(  # type: ignore[call-arg]
        model="claude-stub", base_url=server.base, api_key=api_key, max_retries=0
    )
    guarded = guard_langchain(llm, fuse=fuse)
    yield guarded
    guarded._client.close()


def test_agent_loop_is_stopped(chat_openai: ChatOpenAI, server: AgentServer, api_key: str) -> None:
    agent = create_agent(chat_openai, [lookup])
    with pytest.raises(CeilingExceeded):
        agent.invoke(QUESTION, LIMIT)
    assert server.count(api_key) == UNTIL_TRIP


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_langgraph_react_agent_loop_is_stopped(
    chat_openai: ChatOpenAI, server: AgentServer, api_key: str
) -> None:
    agent = create_react_agent(chat_openai, [lookup])
    with pytest.raises(CeilingExceeded):
        agent.invoke(QUESTION, LIMIT)
    assert server.count(api_key) == UNTIL_TRIP


@pytest.mark.parametrize("model", ["chat_openai", "chat_anthropic"])
def test_streaming_agent_loop_is_stopped(
    model: str, request: pytest.FixtureRequest, server: AgentServer, api_key: str
) -> None:
    # OpenAI streams carry usage only when asked (stream_options.include_usage): the guard asks.
    agent = create_agent(request.getfixturevalue(model), [lookup])
    with pytest.raises(CeilingExceeded):
        for _ in agent.stream(QUESTION, LIMIT, stream_mode="messages"):
            pass
    assert server.count(api_key) == UNTIL_TRIP
    assert all(hit.stream for hit in server.hits if hit.credential == api_key)


async def test_async_streaming_agent_loop_is_stopped(
    achat_openai: ChatOpenAI, server: AgentServer, api_key: str
) -> None:
    agent = create_agent(achat_openai, [lookup])
    with pytest.raises(CeilingExceeded):
        async for _ in agent.astream(QUESTION, LIMIT, stream_mode="messages"):
            pass
    assert server.count(api_key) == UNTIL_TRIP


async def test_async_invoke_is_guarded(
    achat_openai: ChatOpenAI, server: AgentServer, api_key: str
) -> None:
    agent = create_agent(achat_openai, [lookup])
    with pytest.raises(CeilingExceeded):
        await agent.ainvoke(QUESTION, LIMIT)
    assert server.count(api_key) == UNTIL_TRIP


def test_a_bound_model_is_guarded_inside(server: AgentServer, fuse: Fuse, api_key: str) -> None:
    llm = ChatOpenAI(model="stub", base_url=f"{server.base}/v1", api_key=api_key, max_retries=0)
    bound = guard_langchain(llm.bind_tools([lookup]), fuse=fuse)

    def ask_again_and_again() -> None:
        for _ in range(UNTIL_TRIP + 2):
            bound.invoke("find it")

    with pytest.raises(CeilingExceeded):
        ask_again_and_again()
    assert server.count(api_key) == UNTIL_TRIP
    llm.root_client.close()


def test_an_unsupported_model_is_refused_clearly() -> None:
    with pytest.raises(ConfigurationError, match="guard_langchain guards ChatOpenAI"):
        guard_langchain(object())
