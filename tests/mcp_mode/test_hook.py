"""``FuseServerMiddleware`` in the mcp 2.x server's own middleware chain, driven by the real
2.x client in process, on both wires (the 2026-07-28 per-request one and the handshake one)."""

from __future__ import annotations

from typing import Any

import pytest
from mcp import Client, MCPError
from mcp.server.mcpserver import MCPServer

from tests.conftest import Clock
from tokenfuse import BucketPolicy, MemoryStore
from tokenfuse._middleware import inbound_fuse
from tokenfuse._middleware.mcp import McpMode
from tokenfuse._middleware.mcp.hook import FuseServerMiddleware

WIRES = ["auto", "legacy"]


def tool_server(clock: Clock, capacity: float, **options: Any) -> tuple[MCPServer, list[str]]:
    ran: list[str] = []
    fuse = inbound_fuse(MemoryStore(clock=clock), bucket=BucketPolicy(rate=1, capacity=capacity))
    server = MCPServer("tools", middleware=[FuseServerMiddleware(fuse=fuse, **options)])

    @server.tool()
    def refund(order: str) -> str:
        ran.append(f"refund {order}")
        return f"refunded {order}"

    @server.tool()
    def lookup(q: str) -> str:
        ran.append(f"lookup {q}")
        return f"found {q}"

    @server.tool()
    def broken(order: str) -> str:
        ran.append(f"broken {order}")
        raise ValueError("the ledger is locked")

    return server, ran


@pytest.mark.parametrize("wire", WIRES)
async def test_a_refused_call_is_an_error_result_and_protocol_messages_are_free(
    clock: Clock, wire: str
) -> None:
    server, ran = tool_server(clock, capacity=11, cost={"refund": 5})

    async with Client(server, mode=wire) as client:
        for _ in range(5):
            await client.list_tools()  # free, like every protocol message
        results = [await client.call_tool("refund", {"order": str(n)}) for n in range(3)]
        after = await client.call_tool("lookup", {"q": "x"})

    assert ran == ["refund 0", "refund 1", "lookup x"]
    assert [result.is_error for result in results] == [False, False, True]
    text = results[2].content[0].text  # type: ignore[union-attr]
    assert text.startswith("tool 'refund' was not run: call quota exhausted for key anonymous")
    assert not after.is_error


@pytest.mark.parametrize("wire", WIRES)
async def test_the_failure_loop_trips_inside_the_server(clock: Clock, wire: str) -> None:
    server, ran = tool_server(clock, capacity=100)

    async with Client(server, mode=wire) as client:
        results = [await client.call_tool("broken", {"order": "A"}) for _ in range(4)]
        other = await client.call_tool("broken", {"order": "B"})

    assert ran == ["broken A"] * 3 + ["broken B"]
    assert [result.is_error for result in results] == [True] * 4
    assert "failure loop: 'broken' failed 3 times" in results[3].content[0].text  # type: ignore[union-attr]
    assert other.is_error  # it ran, and failed on its own


async def test_refuse_as_error_raises_the_json_rpc_error(clock: Clock) -> None:
    server, ran = tool_server(clock, capacity=1, mode=McpMode(refuse_as="error"))

    async with Client(server, mode="legacy") as client:
        await client.call_tool("lookup", {"q": "1"})
        with pytest.raises(MCPError) as refused:
            await client.call_tool("lookup", {"q": "2"})

    assert ran == ["lookup 1"]
    assert refused.value.error.code == -32029
    assert refused.value.error.data["type"] == "quota_exhausted"


async def test_a_store_down_with_fail_closed_refuses_inside_the_server(clock: Clock) -> None:
    class DownStore(MemoryStore):
        async def arun(self, op: Any) -> Any:
            raise ConnectionError("redis is down")

    ran: list[str] = []
    fuse = inbound_fuse(DownStore(clock=clock), fail_closed=True)
    server = MCPServer("tools", middleware=[FuseServerMiddleware(fuse=fuse)])

    @server.tool()
    def lookup(q: str) -> str:
        ran.append(q)
        return q

    async with Client(server, mode="legacy") as client:
        result = await client.call_tool("lookup", {"q": "x"})

    assert ran == []
    assert result.is_error
    assert "the rate limiter cannot decide right now" in result.content[0].text  # type: ignore[union-attr]
