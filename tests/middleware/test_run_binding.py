"""Inbound run binding: a tool server's own LLM calls count against its caller's run.

The chain is real: an agent inside ``tokenfuse.run`` calls a tool over ``FuseTransport``
(which adds ``TokenFuse-Run``), the tool server's middleware binds that run, and the
handler's own LLM call (its ``FuseTransport``, a mock LLM behind it) spends against it.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import httpx2
import pytest

from tests.conftest import Clock
from tokenfuse import Fuse, FuseTransport, MemoryStore
from tokenfuse._middleware import TokenFuse, TokenFuseWSGI, inbound_fuse
from tokenfuse.guards import BudgetExceeded, current_runs, run

SECRET = "shared deployment secret, 32 chars"
LLM_USAGE = {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150}


def llm(request: Any) -> Any:
    body = {"object": "chat.completion", "model": "m", "choices": [], "usage": LLM_USAGE}
    return httpx2.Response(200, json=body)


class ToolServer:
    """A tool whose handler asks an LLM, through a guarded client of its own."""

    def __init__(self, store: MemoryStore) -> None:
        self.fuse = Fuse(store, secret=SECRET)
        guarded = FuseTransport(httpx2.MockTransport(llm), fuse=self.fuse)
        self.client = httpx2.Client(transport=guarded)
        self.seen: list[tuple[str, ...]] = []

    def handle(self) -> bytes:
        self.seen.append(current_runs())
        self.client.post("https://llm.test/v1/chat/completions", json={"max_tokens": 50})
        return b"done"

    def asgi(self) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            body = self.handle()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": body})

        return TokenFuse(app, fuse=inbound_fuse(self.fuse.store))

    def wsgi(self) -> Any:
        def app(environ: Any, start_response: Any) -> list[bytes]:
            body = self.handle()
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [body]

        return TokenFuseWSGI(app, fuse=inbound_fuse(self.fuse.store))


def test_an_agents_run_reaches_the_tool_servers_llm_calls(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    tool = ToolServer(store)
    agent_fuse = Fuse(store, secret=SECRET)
    inner = httpx2.WSGITransport(app=tool.wsgi())
    agent = httpx2.Client(transport=FuseTransport(inner, fuse=agent_fuse))
    with run("agent-run-7", tokens=350, fuse=agent_fuse) as budget:
        agent.post("http://tool.test/tools/summarise", json={"text": "hi"})
        agent.post("http://tool.test/tools/summarise", json={"text": "hi"})
        assert budget.spent.tokens == 2 * 150  # the tool's LLM calls, counted in the run
        with pytest.raises(BudgetExceeded):  # the third could pass 350: refused in the tool
            agent.post("http://tool.test/tools/summarise", json={"text": "hi"})
        state = budget.read()
    assert tool.seen == [("agent-run-7",)] * 3
    assert state is not None and state.reserved_tokens == 0


async def test_asgi_binds_the_run_from_the_header_or_the_baggage(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    tool = ToolServer(store)
    opener = Fuse(store, secret=SECRET)
    with run("conv-42", tokens=10_000, fuse=opener) as budget:
        pass
    transport = httpx.ASGITransport(app=tool.asgi())
    async with httpx.AsyncClient(transport=transport, base_url="http://tool.test") as client:
        await client.post("/tools/x", headers={"TokenFuse-Run": "conv-42"})
        baggage = "user.id=7,gen_ai.conversation.id=conv%2D42;prop=1"
        await client.post("/tools/x", headers={"baggage": baggage})
        await client.post("/tools/x")  # no run: the call counts for no run
    assert tool.seen == [("conv-42",), ("conv-42",), ()]
    assert budget.spent.tokens == 2 * 150


def test_an_invalid_run_id_is_ignored_with_a_warning(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    tool = ToolServer(MemoryStore(clock=clock))
    client = httpx2.Client(transport=httpx2.WSGITransport(app=tool.wsgi()))
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        client.post("http://tool.test/tools/x", headers={"TokenFuse-Run": "x" * 5_000})
    assert tool.seen == [()]
    assert "ignored a run id" in caplog.text
    assert "x" * 200 not in caplog.text  # the untrusted value itself is not logged
