"""MCP mode inside the server: a middleware for the mcp 2.x ``Server.middleware`` chain.

mcp 2.x runs a chain of ``(ctx, call_next)`` middlewares around every inbound message, with
the method, the raw params, the request id and the negotiated protocol version already
decoded: no body to re-read, and it works on every transport (stdio too). ``FuseServerMiddleware``
puts the same ``McpGate`` there:

    >>> from mcp.server.mcpserver import MCPServer                     # doctest: +SKIP
    >>> server = MCPServer("tools", middleware=[FuseServerMiddleware(cost={"refund": 5})])

A refused ``tools/call`` returns an ``isError`` tool result (or, with
``McpMode(refuse_as="error")``, and for other charged methods, raises an ``MCPError`` with code
``-32029``); there are no HTTP headers here, so the numbers ride in the result's ``_meta`` /
the error's ``data`` only. The caller is identified from the HTTP request under the message
(``identify=``, default the bearer token or ``X-API-Key``); on stdio every message is one
caller, ``anonymous``. mcp is imported only when a refusal must be raised as an error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..._errors import StoreUnavailable
from ..._fuse import Fuse
from ..guard import InboundGuard
from ..identify import IdentifyRequest
from ..options import Anonymous, InboundOptions, Tiers
from ..reply import log_failing_closed
from ..request import AsgiRequest, RequestView
from .classify import Call, Exchange, McpCost, RequestId
from .gate import McpGate
from .mode import McpMode
from .replies import RATE_LIMITED, Refused, answer

__all__ = ["FuseServerMiddleware"]

CallNext = Callable[[Any], Awaitable[Any]]


class FuseServerMiddleware:
    """``TokenFuse(mcp=True)``'s checks as an mcp 2.x server middleware.

    Args: as ``TokenFuse`` (``fuse``, ``identify``, ``anonymous``, ``tiers``, ``shadow``),
    ``cost`` a number or ``{tool name: cost}``, ``mode`` an ``McpMode``.
    """

    def __init__(
        self,
        *,
        fuse: Fuse | None = None,
        identify: IdentifyRequest | None = None,
        anonymous: Anonymous = "shared",
        cost: McpCost = 1.0,
        tiers: Tiers | None = None,
        shadow: bool = False,
        mode: McpMode | None = None,
    ) -> None:
        options = InboundOptions(
            fuse=fuse, identify=identify, anonymous=anonymous, tiers=tiers, shadow=shadow
        )
        guard = InboundGuard(options)
        self.gate = McpGate(guard, mode or McpMode(), cost)

    async def __call__(self, ctx: Any, call_next: CallNext) -> Any:
        request_id: RequestId = ctx.request_id
        params = ctx.params if isinstance(ctx.params, Mapping) else {}
        call = (
            None
            if request_id is None
            else self.gate.classifier.call(request_id, ctx.method, params)
        )
        if call is None:
            return await call_next(ctx)  # notifications and the protocol's own messages
        gate = self.gate
        request = _view(ctx.request)
        plan = gate.guard.plan(request)
        if plan is None:
            return await call_next(ctx)
        exchange = Exchange((call,), (request_id,), False, ctx.protocol_version, True)
        try:
            admission = await gate.admit(plan, exchange, request)
        except StoreUnavailable as exc:  # the fuse fails closed
            log_failing_closed(exc, "an MCP refusal")
            return _refuse(exchange, call, exc, gate.mode)
        if admission.refused is not None:
            return _refuse(exchange, call, admission.refused, gate.mode)
        try:
            result = await call_next(ctx)
        except Exception:
            await gate.failed(plan, call)
            raise
        if _is_error(result):
            await gate.failed(plan, call)
        return result


def _view(request: object) -> RequestView:
    scope = getattr(request, "scope", None)
    return AsgiRequest(scope if isinstance(scope, dict) else {"type": "stdio", "headers": []})


def _refuse(exchange: Exchange, call: Call, refused: Refused, mode: McpMode) -> Any:
    reply = answer(call.id, call, refused, exchange, mode.refuse_as)
    if "result" in reply:
        return reply["result"]
    from mcp.shared.exceptions import MCPError

    error = reply["error"]
    raise MCPError(code=RATE_LIMITED, message=error["message"], data=error["data"])


def _is_error(result: object) -> bool:
    if isinstance(result, Mapping):
        return result.get("isError") is True
    return getattr(result, "is_error", False) is True
