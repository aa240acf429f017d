"""MCP mode over ASGI: ``TokenFuse(app, mcp=True)`` in front of a Streamable HTTP server.

Per request: anything but a ``POST`` passes untouched (the ``GET`` event stream, ``DELETE``);
a ``POST`` body is read once (bounded) and classified; a free exchange goes to the app with
its body replayed and nothing else done; a charged one is admitted by ``McpGate``, then either
answered with an MCP-shaped refusal or run with the rate headers added and its answers
watched for errors, which feed the failure-loop breaker after the response is sent.
"""

from __future__ import annotations

import logging

from ..._errors import StoreUnavailable
from ..asgi import ASGIApp, Receive, Scope, Send, _encode, _send_reply
from ..guard import InboundGuard
from ..reply import log_failing_closed
from ..request import AsgiRequest
from .body import read_body
from .classify import FREE, IdKey, McpCost, id_key
from .gate import Admission, McpGate
from .mode import McpMode
from .replies import refusal
from .watch import ResponseWatch

__all__ = ["McpShell"]

logger = logging.getLogger("tokenfuse.middleware")


class McpShell:
    """Serves one ASGI request in MCP mode, with a middleware's guard and the MCP gate."""

    def __init__(self, guard: InboundGuard, mode: McpMode, cost: McpCost) -> None:
        self.gate = McpGate(guard, mode, cost)

    async def __call__(self, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        gate = self.gate
        request = AsgiRequest(scope)
        plan = gate.guard.plan(request) if request.method == "POST" else None
        if plan is None:
            await app(scope, receive, send)
            return
        body = await read_body(receive, gate.mode.max_body)
        replayed = body.replay(receive)
        if body.data is None and not body.oversized:
            exchange = FREE  # the client left mid-body: the app sees the disconnect too
        else:
            exchange = gate.classifier.classify(body.data, request.header)
        if not exchange.calls:
            await app(scope, replayed, send)
            return
        if not exchange.headers_agree:
            logger.debug("tokenfuse: Mcp-Method/Mcp-Name disagree with the body; body charged")
        try:
            admission = await gate.admit(plan, exchange, request)
        except StoreUnavailable as exc:  # the fuse fails closed
            log_failing_closed(exc, "an MCP refusal")
            admission = Admission(exc, (("Retry-After", "1"),))
        if admission.refused is not None:
            reply = admission.custom or refusal(
                exchange,
                admission.refused,
                admission.headers,
                accept=request.header("accept"),
                refuse_as=gate.mode.refuse_as,
            )
            await _send_reply(send, reply)
            return
        calls = {id_key(call.id): call for call in exchange.calls} if gate.breaker else {}

        async def failed(key: IdKey) -> None:
            await gate.failed(plan, calls[key])

        watch = ResponseWatch(send, _encode(admission.headers), calls, failed)
        await app(scope, replayed, watch.send)
