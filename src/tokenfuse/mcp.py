"""MCP servers: ``TokenFuse(app, mcp=True)`` and what configures it.

In front of an MCP server (Streamable HTTP, any SDK), the middleware reads each JSON-RPC body,
charges ``tools/call`` by tool name, never the protocol's own messages, and refuses in a shape
MCP clients survive and models read. Inside an mcp 2.x server, ``FuseServerMiddleware`` does the
same from the server's own middleware chain. See ``docs/mcp.md``.

>>> from tokenfuse import TokenFuse
>>> from tokenfuse.mcp import McpMode, ToolFailures
>>> app.add_middleware(                                   # doctest: +SKIP
...     TokenFuse, cost={"refund": 5}, mcp=McpMode(failures=ToolFailures(errors=5))
... )
"""

from ._middleware.mcp import META_KEY, RATE_LIMITED, McpMode, ToolFailureLoop, ToolFailures
from ._middleware.mcp.hook import FuseServerMiddleware

__all__ = [
    "META_KEY",
    "RATE_LIMITED",
    "FuseServerMiddleware",
    "McpMode",
    "ToolFailureLoop",
    "ToolFailures",
]
