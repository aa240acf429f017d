"""``TokenFuse`` at the ASGI level: what it forwards untouched, and what it never keeps."""

from __future__ import annotations

import copy
from collections.abc import MutableMapping
from typing import Any

import pytest

from tests.conftest import Clock
from tokenfuse import ConfigurationError, Fuse, Identity, MemoryStore, VelocityPolicy, default_fuse
from tokenfuse._middleware import (
    DECISION_KEY,
    InboundOptions,
    TokenFuse,
    TokenFuseWSGI,
    default_inbound_fuse,
    inbound_fuse,
    report_tokens,
)

Message = MutableMapping[str, Any]
CHUNKS = [b"data: one\n\n", b"data: two\n\n", b"", b"data: three\n\n"]


def http_scope(path: str = "/tools/stream", **headers: str) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
    }


class Recorder:
    """Stands in for the server: feeds one request body, keeps every message sent."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        return {"type": "http.request", "body": b'{"amount": 10}', "more_body": False}

    async def send(self, message: Message) -> None:
        self.sent.append(message)


async def streaming_app(scope: Any, receive: Any, send: Any) -> None:
    request = await receive()
    assert request["body"] == b'{"amount": 10}'  # the request body reaches the app untouched
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    for chunk in CHUNKS:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def test_a_streamed_response_passes_through_message_for_message(clock: Clock) -> None:
    bare, guarded = Recorder(), Recorder()
    await streaming_app(http_scope(), bare.receive, bare.send)
    middleware = TokenFuse(streaming_app, fuse=inbound_fuse(MemoryStore(clock=clock)))

    await middleware(
        http_scope(authorization="Bearer sk-stream-0001"), guarded.receive, guarded.send
    )

    start, *body = guarded.sent
    assert body == bare.sent[1:]  # every body message, in order, unchanged
    assert start["status"] == 200
    assert start["headers"] == [
        (b"content-type", b"text/event-stream"),
        (b"ratelimit-policy", b'"default";q=50;w=5'),
        (b"ratelimit", b'"default";r=49;t=1'),
    ]


@pytest.mark.parametrize("kind", ["websocket", "lifespan"])
async def test_non_http_scopes_pass_straight_through(kind: str) -> None:
    seen: list[tuple[Any, Any, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope, receive, send))

    recorder = Recorder()
    scope = {"type": kind, "path": "/ws", "headers": []}

    await TokenFuse(app, fuse=inbound_fuse(MemoryStore()))(scope, recorder.receive, recorder.send)

    assert seen == [(scope, recorder.receive, recorder.send)]
    assert scope == {"type": kind, "path": "/ws", "headers": []}


async def test_malformed_header_pairs_break_no_request_and_keep_its_caller(clock: Clock) -> None:
    middleware = TokenFuse(streaming_app, fuse=inbound_fuse(MemoryStore(clock=clock)))
    malformed: list[Any] = [(b"x-a", b"1", b"extra"), ("x-api-key", "text"), (b"x-b", 7)]

    starts = []
    for key in ("sk-malformed-0001", "sk-malformed-0002"):
        recorder = Recorder()
        scope = http_scope(authorization=f"Bearer {key}")
        scope["headers"] = [*malformed, *scope["headers"]]
        await middleware(scope, recorder.receive, recorder.send)
        starts.append(recorder.sent[0])

    assert [start["status"] for start in starts] == [200, 200]
    # each caller in a bucket of its own (the anonymous one would have left r=48)
    assert [dict(start["headers"])[b"ratelimit"] for start in starts] == [
        b'"default";r=49;t=1',
        b'"default";r=49;t=1',
    ]


async def test_only_the_tokens_header_is_taken_out_of_the_response(clock: Clock) -> None:
    sent_headers = [
        (b"content-type", b"text/plain"),
        (b"TokenFuse-Tokens", b"7"),  # any case, as an app may write it
        (b"tokenfuse-tokenz", b"8"),  # as long as it, and kept
        (b"x-other", b"9"),
    ]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": sent_headers})
        await send({"type": "http.response.body", "body": b"ok"})

    fuse = inbound_fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(unit="tokens"))
    recorder = Recorder()
    await TokenFuse(app, fuse=fuse, count="tokens")(
        http_scope(authorization="Bearer sk-tokens-0001"), recorder.receive, recorder.send
    )

    names = [name for name, _ in recorder.sent[0]["headers"]]
    assert names[:3] == [b"content-type", b"tokenfuse-tokenz", b"x-other"]
    assert b"TokenFuse-Tokens" not in names
    assert fuse.status(Identity.secret("sk-tokens-0001")).rate == 7.0


def test_websockets_and_lifespan_work_behind_it_in_starlette() -> None:
    from contextlib import asynccontextmanager

    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.routing import WebSocketRoute
    from starlette.testclient import TestClient
    from starlette.websockets import WebSocket

    started: list[bool] = []

    async def echo(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text(await websocket.receive_text())
        await websocket.close()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> Any:
        started.append(True)
        yield

    app = Starlette(
        routes=[WebSocketRoute("/ws", echo)],
        middleware=[Middleware(TokenFuse, fuse=inbound_fuse(MemoryStore()))],
        lifespan=lifespan,
    )
    with TestClient(app) as client, client.websocket_connect("/ws") as ws:
        ws.send_text("ping")
        assert ws.receive_text() == "ping"
    assert started == [True]


@pytest.mark.parametrize("framework", ["fastapi", "starlette"])
def test_zero_arguments_guard_every_route_on_the_process_wide_store(
    framework: str, environment: Any
) -> None:
    from starlette.testclient import TestClient

    environment({})  # the embedded default, whatever Redis the suite runs against

    if framework == "fastapi":
        from fastapi import FastAPI

        app: Any = FastAPI()
        app.add_api_route("/tools/refund", lambda: {"ok": True}, methods=["POST"])
        app.add_middleware(TokenFuse)
    else:
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def refund(request: Any) -> JSONResponse:
            return JSONResponse({"ok": True})

        app = Starlette(routes=[Route("/tools/refund", refund, methods=["POST"])])
        app.add_middleware(TokenFuse)
    token = f"sk-zero-args-{framework}-0001"

    with TestClient(app) as client:
        reply = client.post("/tools/refund", headers={"Authorization": f"Bearer {token}"})

    assert reply.status_code == 200
    assert reply.headers["ratelimit-policy"] == '"default";q=50;w=5'
    fuse = default_inbound_fuse()
    assert fuse.store is default_fuse().store
    assert fuse.name == "inbound"
    assert fuse.velocity is not None
    assert fuse.velocity.unit == "calls"


def test_the_instance_keeps_no_per_request_state(clock: Clock) -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    seen: list[object] = []

    async def refund(request: Request) -> JSONResponse:
        seen.append(request.scope[DECISION_KEY])  # the decision is the request's, in its scope
        report_tokens(5)
        return JSONResponse({"ok": True})

    fuse = inbound_fuse(MemoryStore(clock=clock))
    middleware = TokenFuse(
        Starlette(routes=[Route("/r", refund, methods=["POST"])]), fuse=fuse, count="tokens"
    )
    before = copy.copy(vars(middleware))
    guard_before = {k: v for k, v in vars(middleware.guard).items() if k != "_fuses"}

    with TestClient(middleware) as client:
        for n in range(5):
            client.post("/r", headers={"X-API-Key": f"key-{n:08d}"})

    assert vars(middleware) == before
    assert {k: v for k, v in vars(middleware.guard).items() if k != "_fuses"} == guard_before
    assert len(seen) == 5
    assert all(decision.allowed for decision in seen)  # type: ignore[attr-defined]


async def test_tokens_reported_before_the_app_fails_are_still_recorded(clock: Clock) -> None:
    fuse = inbound_fuse(MemoryStore(clock=clock))

    async def failing(scope: Any, receive: Any, send: Any) -> None:
        report_tokens(42)
        raise RuntimeError("handler bug")

    recorder = Recorder()
    with pytest.raises(RuntimeError, match="handler bug"):
        await TokenFuse(failing, fuse=fuse, count="tokens")(
            http_scope(**{"x-api-key": "key-failing-1"}), recorder.receive, recorder.send
        )

    from tokenfuse import Identity

    assert fuse.status(Identity.secret("key-failing-1")).rate == 42.0


class SyncOnlyStore:
    """Only the sync face of a store (like a RedisStore built on a sync client)."""

    def __init__(self) -> None:
        self._inner = MemoryStore()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("a"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def run(self, op: Any) -> Any:
        return self._inner.run(op)


class AsyncOnlyStore:
    """Only the async face of a store (like a RedisStore built on an asyncio client)."""

    def __init__(self) -> None:
        self._inner = MemoryStore()

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("a"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_each_middleware_checks_its_store_has_the_face_it_needs() -> None:
    sync_only, async_only = Fuse(SyncOnlyStore()), Fuse(AsyncOnlyStore())

    def wsgi(environ: Any, start_response: Any) -> list[bytes]:
        return []

    with pytest.raises(ConfigurationError, match=r"async face; .* is sync-only .*TokenFuseWSGI"):
        TokenFuse(streaming_app, fuse=sync_only)
    with pytest.raises(ConfigurationError, match=r"sync face; .* is async-only .*TokenFuse for"):
        TokenFuseWSGI(wsgi, fuse=async_only)
    assert TokenFuseWSGI(wsgi, fuse=sync_only).guard.fuse is sync_only
    assert TokenFuse(streaming_app, fuse=async_only).guard.fuse is async_only


def test_options_are_keyword_only_typed_and_the_same_for_both_protocols() -> None:
    """What lets ``add_middleware(TokenFuse, **options)`` type-check the options."""
    import inspect

    asgi = inspect.signature(TokenFuse.__init__).parameters
    wsgi = inspect.signature(TokenFuseWSGI.__init__).parameters
    options = [p for name, p in asgi.items() if name not in ("self", "app")]

    assert options
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in options)
    assert all(p.annotation is not inspect.Parameter.empty for p in options)
    assert [(p.name, p.annotation, p.default) for p in options] == [
        (p.name, p.annotation, p.default) for name, p in wsgi.items() if name not in ("self", "app")
    ]
    # ... and they are InboundOptions, the one place the options are declared.
    declared = inspect.signature(InboundOptions).parameters.values()
    assert [(p.name, p.default) for p in options] == [(p.name, p.default) for p in declared]


def test_a_middleware_never_renders_its_options() -> None:
    """``tiers`` may be keyed by raw credentials: the repr must not show them."""
    from tokenfuse import GROWTH

    secret = "sk-live-0123456789abcdef"
    middleware = TokenFuse(streaming_app, fuse=inbound_fuse(MemoryStore()), tiers={secret: GROWTH})

    assert secret not in repr(middleware)
    assert secret not in repr(InboundOptions(tiers={secret: GROWTH}))
