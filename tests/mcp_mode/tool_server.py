"""The MCP server the MCP tests run: the SDK's own server (``MCPServer`` on mcp 2.x,
``FastMCP`` on mcp 1.x, whichever this interpreter has) over Streamable HTTP, guarded by
``TokenFuse(mcp=True)``, under uvicorn.

    python tests/mcp/tool_server.py PORT

Tools: ``lookup(q)`` (cheap), ``refund(order, amount)`` (cost 5; an amount <= 0 is an error
result). ``GET /stats`` answers what the tools really executed, counted here on the server:
the tests compare it with what the clients were told. The bucket is ``SERVER_CAPACITY`` calls,
refilling at ``SERVER_RATE``/s (slow: the tests count admissions without a clock).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import Any

from tokenfuse import BucketPolicy, MemoryStore
from tokenfuse._middleware import TokenFuse, inbound_fuse
from tokenfuse._middleware.mcp import McpMode, ToolFailures

try:  # mcp 2.x
    from mcp.server.mcpserver import MCPServer as Server
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as Server

executed: Counter[str] = Counter()
server = Server("tokenfuse-test")


@server.tool()
def lookup(q: str) -> str:
    """Look a customer up."""
    executed["lookup"] += 1
    return f"customer {q}: ok"


@server.tool()
def refund(order: str, amount: float) -> str:
    """Refund an order."""
    if amount <= 0:
        executed["refund_failed"] += 1
        raise ValueError(f"refund of {amount} refused: the amount must be positive")
    executed["refund"] += 1
    return f"refunded {amount} on {order}"


def _mcp_app() -> Any:
    if "json_response" in Server.__init__.__code__.co_varnames:  # 1.x sets it on the server
        return server.streamable_http_app()
    return server.streamable_http_app(json_response=False)


bucket = BucketPolicy(
    rate=float(os.environ.get("SERVER_RATE", "0.001")),
    capacity=float(os.environ.get("SERVER_CAPACITY", "50")),
)
guarded = TokenFuse(
    _mcp_app(),
    fuse=inbound_fuse(MemoryStore(), bucket=bucket),
    cost={"refund": 5},
    mcp=McpMode(failures=ToolFailures(errors=3)),
)


async def app(scope: Any, receive: Any, send: Any) -> None:
    """``/stats`` beside the guarded MCP app (which gets everything else, lifespan too)."""
    if scope["type"] == "http" and scope["path"] == "/stats":
        body = json.dumps(dict(executed)).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    await guarded(scope, receive, send)


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
