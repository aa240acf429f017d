"""Inbound: ``TokenFuse``, the pure ASGI middleware (Starlette, FastAPI, any ASGI app).

It speaks ASGI and nothing else: the options, the decision, the refusal, the headers and the
token report come from ``InboundGuard`` (``guard.py``), shared with the WSGI middleware.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .._errors import StoreUnavailable
from .guard import Outcome
from .mcp.mode import McpMode
from .reply import Headers, Reply, unavailable
from .report import parse_amount
from .request import AsgiRequest
from .run_binding import run_of
from .shell import InboundMiddleware

__all__ = ["TokenFuse"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _encode(headers: Headers) -> list[tuple[bytes, bytes]]:
    return [
        (name.lower().encode("latin-1", "replace"), value.encode("latin-1", "replace"))
        for name, value in headers
    ]


async def _send_reply(send: Send, reply: Reply) -> None:
    headers = _encode(reply.headers)
    if not any(name == b"content-length" for name, _ in headers):
        headers.append((b"content-length", str(len(reply.body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": reply.body})


class TokenFuse(InboundMiddleware[ASGIApp]):
    """Contain each caller of an ASGI app: a token bucket plus the velocity check.

    >>> app.add_middleware(TokenFuse)                                   # doctest: +SKIP
    >>> app.add_middleware(                                             # doctest: +SKIP
    ...     TokenFuse,
    ...     fuse=inbound_fuse(RedisStore.from_url("redis://localhost:6379/0"), bucket=STARTER),
    ...     cost={"/tools/refund": 5},
    ...     exclude=["/health"],
    ... )

    The keyword options (``fuse``, ``identify``, ``anonymous``, ``cost``, ``tiers``, ``count``,
    ``exclude``, ``shadow``, ``refusal``, ``policy_name``, ``tokens_header``, ``mcp``) are
    described in ``InboundOptions``; the fuse's store needs an async face.
    """

    face = "async"
    otherwise = "TokenFuseWSGI for WSGI apps"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._tokens_header = self.guard.tokens_header.encode("latin-1")
        mode = McpMode.of(self.mcp)
        self._mcp = None
        if mode is not None:
            from .mcp.asgi import McpShell  # loaded only in front of MCP servers

            self._mcp = McpShell(self.guard, mode, self.cost)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._guarded(scope, receive, send, AsgiRequest(scope))
            return
        request = AsgiRequest(scope)
        with run_of(request):  # run budgets: the caller's run, bound for the handler
            await self._guarded(scope, receive, send, request)

    async def _guarded(
        self, scope: Scope, receive: Receive, send: Send, request: AsgiRequest
    ) -> None:
        if self._mcp is not None and scope["type"] == "http":
            await self._mcp(scope, receive, send, self.app)
            return
        plan = self.guard.plan(request) if scope["type"] == "http" else None
        if plan is None:
            await self.app(scope, receive, send)
            return
        try:
            decision = await plan.aadmit()
        except StoreUnavailable as exc:
            await _send_reply(send, unavailable(exc))
            return
        outcome = self.guard.settle(plan, decision, request)
        if outcome.reply is not None:
            await _send_reply(send, outcome.reply)
            return
        send = self._with_headers(send, outcome)
        report = outcome.report
        if report is None:
            await self.app(scope, receive, send)
            return
        try:
            with report.active():
                await self.app(scope, receive, send)
        finally:
            await self.guard.arecord(plan, report)

    def _with_headers(self, send: Send, outcome: Outcome) -> Send:
        """``send``, adding the outcome's headers to the response and taking the tokens header
        out of it (into the report, when counting tokens)."""
        extra = _encode(outcome.headers)
        tokens_header, report = self._tokens_header, outcome.report

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = []
                for name, value in message.get("headers", ()):
                    if bytes(name).lower() == tokens_header:
                        if report is not None:
                            report.add(parse_amount(bytes(value)))
                        continue
                    headers.append((name, value))
                headers.extend(extra)
                message = {**message, "headers": headers}
            await send(message)

        return send_with_headers
