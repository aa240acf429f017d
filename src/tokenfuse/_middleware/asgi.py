"""``TokenFuse``: the pure ASGI middleware (Starlette, FastAPI, any ASGI app).

It speaks ASGI and nothing else: the decision, the refusal and the headers come from
``Guard`` (``policy.py``), shared with the WSGI middleware.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .._errors import ConfigurationError, StoreUnavailable
from .._fuse import Fuse
from .identify import Identify
from .mcp.gate import McpMode
from .policy import Anonymous, Cost, Count, Exclude, Guard, Refusal, Reply, Tiers, logger
from .report import DECISION_KEY, REPORT_KEY, TOKENS_HEADER, Report, _current, parse_amount
from .request import AsgiRequest

__all__ = ["TokenFuse"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _encode(headers: tuple[tuple[str, str], ...]) -> list[tuple[bytes, bytes]]:
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


class TokenFuse:
    """Contain each caller of an ASGI app: a token bucket plus the velocity check.

    >>> app.add_middleware(TokenFuse)                                   # doctest: +SKIP
    >>> app.add_middleware(                                             # doctest: +SKIP
    ...     TokenFuse,
    ...     fuse=inbound_fuse(RedisStore.from_url("redis://localhost:6379/0"), bucket=STARTER),
    ...     cost={"/tools/refund": 5},
    ...     exclude=["/health"],
    ... )

    Args:
        fuse: the ``Fuse`` to decide with (``inbound_fuse(...)``); by default the process-wide
            ``default_inbound_fuse()``: ``FREE`` bucket and ``CALL_VELOCITY`` on the
            embedded store.
        identify: ``request -> Identity | str | None``; default ``bearer_or_api_key``.
        anonymous: requests without an identity share one ``anonymous`` identity
            (``"shared"``, the default) or pass unguarded (``"allow"``).
        cost: bucket cost per call: a number, ``{path prefix: cost}`` (longest prefix wins,
            others cost 1), or ``request -> cost`` (an error or invalid value costs 1).
        tiers: bucket policy per identity: ``{name or credential: BucketPolicy}`` or
            ``(request, identity) -> BucketPolicy | None``. Live overrides
            (``Fuse.set_bucket``) win over both.
        count: what the velocity check counts: ``"calls"``, or ``"tokens"`` the handler
            reports (``TokenFuse-Tokens`` response header or ``report_tokens``).
        exclude: path prefixes (``["/health"]``) or ``request -> bool``: not guarded at all.
        shadow: decide, log and send the headers, but never refuse.
        refusal: ``(error, request) -> Reply`` to shape refusals; ``Retry-After`` and the
            ``RateLimit`` headers are added unless the reply sets them.
        policy_name: the policy's name in the ``RateLimit`` headers.
        tokens_header: the response header a handler may report tokens in (stripped).
        mcp: ``True`` (or an ``McpMode``) in front of an MCP server: charge ``tools/call``
            by tool name (``cost={"refund": 5}``), never the protocol's own messages, and
            refuse in MCP's shape (``docs/mcp.md``).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        fuse: Fuse | None = None,
        identify: Identify | None = None,
        anonymous: Anonymous = "shared",
        cost: Cost = 1.0,
        tiers: Tiers | None = None,
        count: Count = "calls",
        exclude: Exclude = (),
        shadow: bool = False,
        refusal: Refusal | None = None,
        policy_name: str = "default",
        tokens_header: str = TOKENS_HEADER,
        mcp: bool | McpMode = False,
    ) -> None:
        self.app = app
        mode = McpMode.of(mcp)
        self.guard = Guard(
            fuse=fuse,
            identify=identify,
            anonymous=anonymous,
            cost=cost if mode is None else 1.0,  # MCP mode prices tools, not paths
            tiers=tiers,
            count=count,
            exclude=exclude,
            shadow=shadow,
            refusal=refusal,
            policy_name=policy_name,
        )
        if not self.guard.fuse.has_async:
            raise ConfigurationError(
                f"TokenFuse needs a store with an async face; {self.guard.fuse.store!r} is "
                "sync-only (use RedisStore.from_url, or TokenFuseWSGI for WSGI apps)"
            )
        self.tokens_header = tokens_header.lower().encode("latin-1")
        self.mcp = None
        if mode is not None:
            from .mcp.asgi import McpShell  # loaded only for MCP servers

            self.mcp = McpShell(self.guard, mode, cost)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.mcp is not None:
            await self.mcp(scope, receive, send, self.app)
            return
        guard = self.guard
        request = AsgiRequest(scope)
        plan = guard.plan(request)
        if plan is None:
            await self.app(scope, receive, send)
            return
        try:
            decision = await plan.fuse.aadmit(
                plan.identity, cost=plan.cost, amount=plan.amount, bucket=plan.bucket
            )
        except StoreUnavailable as exc:
            await _send_reply(send, guard.unavailable(exc))
            return
        scope[DECISION_KEY] = decision
        outcome = guard.settle(plan, decision, request)
        if outcome.reply is not None:
            await _send_reply(send, outcome.reply)
            return

        extra = _encode(outcome.headers)
        tokens_header = self.tokens_header
        report = Report() if guard.count == "tokens" else None

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

        if report is None:
            await self.app(scope, receive, send_with_headers)
            return
        scope[REPORT_KEY] = report
        token = _current.set(report)
        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            _current.reset(token)
            total = report.total
            if total > 0:
                try:
                    await plan.fuse.arecord(plan.identity, total)
                except StoreUnavailable:
                    logger.warning("tokenfuse: store unavailable, %g tokens not recorded", total)
