"""Inbound: ``TokenFuse``, the pure ASGI middleware (Starlette, FastAPI, any ASGI app).

It speaks ASGI and nothing else: the options, the decision, the refusal, the headers and the
token report come from ``InboundGuard`` (``guard.py``), shared with the WSGI middleware.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from functools import lru_cache
from typing import Any

from .._errors import StoreUnavailable
from .._leases import Leases
from .._runs.context import bind_run_id
from .guard import Outcome
from .loops import has_body, read_asgi_body
from .mcp.mode import McpMode
from .reply import Headers, Reply, unavailable
from .report import parse_amount
from .request import AsgiRequest
from .run_binding import run_id_of
from .shell import InboundMiddleware

__all__ = ["TokenFuse"]

#: Where a guarded request's response status is kept in its scope, for the loop breaker.
_STATUS = "tokenfuse.status"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _encode(headers: Headers) -> list[tuple[bytes, bytes]]:
    encoded = []  # a loop, not a list comprehension: no frame of its own on every request
    for name, value in headers:
        encoded.append((_name(name), value.encode("latin-1", "replace")))
    return encoded


@lru_cache(maxsize=256)  # the few names of the middleware's own headers and a refusal's
def _name(name: str) -> bytes:
    return name.lower().encode("latin-1", "replace")


def _giving_leases_back(receive: Receive, leases: Leases) -> Receive:
    """``receive`` for the lifespan: at shutdown, give every lease back first, while the
    app's store is still open (its own shutdown handlers may close it)."""

    async def receive_and_give_back() -> Message:
        message = await receive()
        if message.get("type") == "lifespan.shutdown":
            await leases.aclose()
        return message

    return receive_and_give_back


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
    ``exclude``, ``shadow``, ``refusal``, ``policy_name``, ``tokens_header``, ``mcp``,
    ``lease``) are described in ``InboundOptions``; the fuse's store needs an async face.
    With ``lease``, the leases go back to the store when the server shuts the app down (ASGI
    lifespan), before the app's own shutdown handlers run.
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
        run_id = run_id_of(request)  # run budgets: the caller's run, bound for the handler
        if run_id is None:  # most requests: no context to enter and leave (``run_of``'s)
            await self._guarded(scope, receive, send, request)
            return
        with bind_run_id(run_id):
            await self._guarded(scope, receive, send, request)

    async def _guarded(
        self, scope: Scope, receive: Receive, send: Send, request: AsgiRequest
    ) -> None:
        if self._mcp is not None and scope["type"] == "http":
            await self._mcp(scope, receive, send, self.app)
            return
        if scope["type"] == "lifespan" and self.guard.leases is not None:
            await self.app(scope, _giving_leases_back(receive, self.guard.leases), send)
            return
        plan = self.guard.plan(request) if scope["type"] == "http" else None
        if plan is None:
            await self.app(scope, receive, send)
            return
        body = None
        # The failure-loop breaker fingerprints the body (loops.py). Awaited only when there
        # is one: each coroutine made and awaited is work on every request.
        if self.guard.loops is not None and has_body(request):
            body, receive = await read_asgi_body(request, receive)
        try:  # one round trip: the admission and the failure-loop check
            admission = await self.guard.aadmit(plan, request, body)
        except StoreUnavailable as exc:
            await _send_reply(send, unavailable(exc))
            return
        outcome = self.guard.settle(plan, admission.decision, request)
        if outcome.reply is not None:
            await _send_reply(send, outcome.reply)
            return
        watch = None
        if admission.check is not None:  # the breaker is on: its verdict, or its check now
            if admission.sent:  # the verdict came with the admission: nothing to await
                watch, reply = self.guard.check_loops(plan, admission, request)
            else:
                watch, reply = await self.guard.acheck_loops(plan, admission, request)
            if reply is not None:
                await _send_reply(send, reply)
                return
        send = self._with_headers(send, outcome, scope if watch is not None else None)
        report = outcome.report
        try:
            if report is None:
                await self.app(scope, receive, send)
                return
            try:
                with report.active():
                    await self.app(scope, receive, send)
            finally:
                await self.guard.arecord(plan, report)
        finally:
            # Status 500 if none was sent. Most calls have nothing to note (a success ending
            # no failures): asked first, so that they make no coroutine to await.
            status = scope.get(_STATUS, 500)
            if watch is not None and self.guard.loops is not None and watch.wants_note(status):
                await self.guard.loops.anote(watch, status)

    def _with_headers(self, send: Send, outcome: Outcome, keep_status: Scope | None) -> Send:
        """``send``, adding the outcome's headers to the response and taking the tokens header
        out of it (into the report, when counting tokens); the status is kept in
        ``keep_status`` (the request's scope) for the failure-loop breaker."""
        extra = _encode(outcome.headers)
        tokens_header, report = self._tokens_header, outcome.report
        size = len(tokens_header)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                if keep_status is not None:
                    keep_status[_STATUS] = int(message.get("status", 500))
                headers = []
                for name, value in message.get("headers", ()):
                    # The length first: most names differ in it, and need no lower-cased copy.
                    if len(name) == size and bytes(name).lower() == tokens_header:
                        if report is not None:
                            report.add(parse_amount(bytes(value)))
                        continue
                    headers.append((name, value))
                headers.extend(extra)
                message = {**message, "headers": headers}
            await send(message)

        return send_with_headers
