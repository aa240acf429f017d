"""An MCP server with a refund tool, guarded by TokenFuse in MCP mode (mcp 2.x, Streamable HTTP).

    python examples/mcp_server/server.py          # serves http://127.0.0.1:8000/mcp (PORT=...)

Each caller (``Authorization: Bearer <key>``) gets a bucket of 50 that refills at 1 per
second. ``lookup_order`` costs 1 of it, ``refund`` 5; the protocol's own messages (the
handshake, pings, tool listings, the event stream) cost nothing. The same failing call made
3 times within a minute is refused for a minute, naming the tool. Run
``python examples/mcp_server/agent.py`` against it to watch a runaway agent get stopped.
"""

from __future__ import annotations

import os

import uvicorn
from mcp.server.mcpserver import MCPServer

from tokenfuse import BucketPolicy, FuseEvent, MemoryStore, TokenFuse, inbound_fuse

server = MCPServer("support-tools")
ledger: dict[str, float] = {}


@server.tool()
def lookup_order(order_id: str) -> str:
    """Look an order up: its status and what was refunded on it."""
    return f"order {order_id}: delivered, refunded so far {ledger.get(order_id, 0.0):.2f}"


@server.tool()
def refund(order_id: str, amount: float) -> str:
    """Refund part of an order. Real money: this is the tool a runaway agent must not loop on."""
    if amount <= 0:
        raise ValueError(f"cannot refund {amount}: the amount must be positive")
    ledger[order_id] = ledger.get(order_id, 0.0) + amount
    return f"refunded {amount:.2f} on {order_id} (total {ledger[order_id]:.2f})"


def alert(event: FuseEvent) -> None:
    """Where a real service would page someone."""
    print(f"ALERT {event.kind}: {event.detail}", flush=True)


fuse = inbound_fuse(MemoryStore(), bucket=BucketPolicy(rate=1, capacity=50), on_event=alert)
app = TokenFuse(server.streamable_http_app(), fuse=fuse, cost={"refund": 5}, mcp=True)

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
