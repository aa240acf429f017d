"""The inbound failure-loop breaker with real Starlette and Flask apps, on both stores.

A tool endpoint that answers bad arguments with a 422: the same caller sending the same
arguments gets three 422s from the app, then a 429 from the middleware whose JSON says it is a
failure loop, which call and how many times, and the app is not called again. Other arguments,
other callers, and a body of any size still reach the app, byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack, asynccontextmanager
from typing import Any

import pytest

from tests.conftest import Clock
from tokenfuse import FREE, Fuse, MemoryStore, StoreUnavailable
from tokenfuse._middleware import CALL_VELOCITY, TokenFuse, TokenFuseWSGI, inbound_fuse
from tokenfuse._transport import FailureLoopPolicy, forget_loops
from tokenfuse.fuse import Identity

SECRET = "a test secret, at least 32 characters long"
AUTH = {"X-API-Key": "sk-agent-0001", "Content-Type": "application/json"}
Call = Callable[..., Any]


class Served:
    """What the app saw: each body, byte for byte."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []


def lookup(served: Served, body: bytes) -> tuple[int, dict[str, Any]]:
    served.bodies.append(body)
    try:
        data = json.loads(body or b"{}")
    except (ValueError, RecursionError):
        return 400, {"error": "not json"}
    if data.get("id") == "crash":
        raise RuntimeError("the tool crashed")
    if not isinstance(data.get("id"), int):
        return 422, {"error": "id must be an integer"}
    return 200, {"found": data["id"]}


def parsed(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None  # an HTML error page


def starlette_app(stack: ExitStack, served: Served, **options: Any) -> Call:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
    from starlette.testclient import TestClient

    async def endpoint(request: Request) -> Response:
        status, data = lookup(served, await request.body())
        return JSONResponse(data, status_code=status)

    store = options["fuse"].store
    closing = getattr(store, "aclose", None)

    @asynccontextmanager
    async def lifespan(app: Any) -> Any:  # the asyncio client closes on the app's own loop
        yield
        if closing is not None:
            await closing()

    app = Starlette(
        routes=[Route("/tools/lookup", endpoint, methods=["POST", "GET"])],
        middleware=[Middleware(TokenFuse, **options)],
        lifespan=lifespan,
    )
    client = stack.enter_context(TestClient(app, raise_server_exceptions=False))

    def call(body: bytes, headers: dict[str, str] = AUTH, query: str = "") -> Any:
        response = client.post("/tools/lookup" + query, content=body, headers=headers)
        return response.status_code, parsed(response.content)

    return call


def flask_app(stack: ExitStack, served: Served, **options: Any) -> Call:
    from flask import Flask, request

    app = Flask(__name__)

    @app.post("/tools/lookup")
    def endpoint() -> Any:
        status, data = lookup(served, request.get_data())
        return data, status

    app.wsgi_app = TokenFuseWSGI(app.wsgi_app, **options)  # type: ignore[method-assign]
    client = app.test_client()

    def call(body: bytes, headers: dict[str, str] = AUTH, query: str = "") -> Any:
        response = client.post("/tools/lookup" + query, data=body, headers=headers)
        data = response.get_data()
        response.close()
        return response.status_code, parsed(data)

    return call


APPS = {"starlette": starlette_app, "flask": flask_app}


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def fuse(request: pytest.FixtureRequest, clock: Clock) -> Iterator[Fuse]:
    if request.param == "memory":
        store: Any = MemoryStore(clock=clock)
    else:
        from tokenfuse.stores import RedisStore

        url = request.getfixturevalue("redis_url")
        store = RedisStore.from_url(
            url, prefix=request.getfixturevalue("redis_prefix"), clock=clock
        )
    yield Fuse(store, name="inbound", bucket=FREE, velocity=CALL_VELOCITY, secret=SECRET)
    close = getattr(store, "close", None)
    if close is not None:
        close()


@pytest.fixture(params=sorted(APPS))
def serve(request: pytest.FixtureRequest) -> Iterator[Callable[..., tuple[Call, Served]]]:
    with ExitStack() as stack:

        def make(**options: Any) -> tuple[Call, Served]:
            served = Served()
            return APPS[request.param](stack, served, **options), served

        yield make


BAD = json.dumps({"id": "forty-two", "note": "é"}).encode()


def test_the_same_failing_call_gets_a_429_that_names_it(
    serve: Callable[..., tuple[Call, Served]], fuse: Fuse
) -> None:
    call, served = serve(fuse=fuse)
    for _ in range(3):
        assert call(BAD)[0] == 422
    status, body = call(BAD)
    assert status == 429
    assert body["type"] == "failure_loop"
    assert body["call"].startswith("POST /tools/lookup #")
    assert body["count"] == 3 and body["window"] == 120
    assert "failed 3 times" in body["message"] and "HTTP 422" in body["message"]
    assert "forty-two" not in json.dumps(body)  # the arguments are never echoed
    assert served.bodies == [BAD] * 3  # the app was not called again, and got every byte


def test_other_arguments_and_other_callers_still_reach_the_app(
    serve: Callable[..., tuple[Call, Served]], fuse: Fuse
) -> None:
    call, served = serve(fuse=fuse)
    for _ in range(3):
        call(BAD)
    assert call(json.dumps({"id": 7}).encode()) == (200, {"found": 7})
    assert served.bodies[-1] == json.dumps({"id": 7}).encode()
    assert call(json.dumps({"note": "é", "id": "forty-two"}).encode())[0] == 429  # key order
    assert call(BAD, query="?b=2&a=1")[0] == 422  # another query is another call
    other = {**AUTH, "X-API-Key": "sk-agent-0002"}
    assert call(BAD, headers=other)[0] == 422
    assert forget_loops(Identity.secret("sk-agent-0001"), fuse=fuse) >= 1
    assert call(BAD)[0] == 422


def test_query_parameters_in_any_order_are_the_same_call(
    serve: Callable[..., tuple[Call, Served]], fuse: Fuse
) -> None:
    call, _ = serve(fuse=fuse)
    for query in ("?a=1&key=sk-in-query", "?key=sk-in-query&a=1", "?a=1&key=sk-in-query"):
        assert call(BAD, query=query)[0] == 422
    status, body = call(BAD, query="?key=sk-in-query&a=1")
    assert status == 429 and body["call"].startswith("POST /tools/lookup #")
    assert "sk-in-query" not in json.dumps(body)  # the query is hashed, never shown


def test_a_crashing_tool_counts_as_a_failure(
    serve: Callable[..., tuple[Call, Served]], fuse: Fuse
) -> None:
    call, served = serve(fuse=fuse)
    crash = json.dumps({"id": "crash"}).encode()
    for _ in range(3):
        assert call(crash)[0] == 500
    assert call(crash)[0] == 429
    assert len(served.bodies) == 3


def test_failures_spread_past_the_window_and_successes_never_trip(
    serve: Callable[..., tuple[Call, Served]], fuse: Fuse, clock: Clock
) -> None:
    call, served = serve(fuse=fuse)
    for _ in range(5):
        assert call(BAD)[0] == 422
        clock.advance(70)
    good = json.dumps({"id": 1}).encode()
    for _ in range(6):
        assert call(good)[0] == 200
    assert len(served.bodies) == 11


def test_the_cooldown_ends(
    serve: Callable[..., tuple[Call, Served]], fuse: Fuse, clock: Clock
) -> None:
    call, _ = serve(fuse=fuse, failure_loops=FailureLoopPolicy(failures=2, cooldown=10))
    call(BAD), call(BAD)
    assert call(BAD)[0] == 429
    clock.advance(10)
    assert call(BAD)[0] == 422


def test_a_large_body_reaches_the_app_whole(
    serve: Callable[..., tuple[Call, Served]], fuse: Fuse
) -> None:
    call, served = serve(fuse=fuse)
    big = json.dumps({"id": 5, "pad": "x" * (3 << 20)}).encode()  # past the read bound
    assert call(big) == (200, {"found": 5})
    assert served.bodies == [big]


def test_bad_bodies_never_break_a_request(
    serve: Callable[..., tuple[Call, Served]], fuse: Fuse
) -> None:
    call, served = serve(fuse=fuse)
    for body in (b"\xff\xfe not json", b"[" * 50_000 + b"]" * 50_000, b""):
        assert call(body)[0] in (400, 422)
    assert len(served.bodies) == 3


def test_off_with_none(serve: Callable[..., tuple[Call, Served]], fuse: Fuse) -> None:
    call, served = serve(fuse=fuse, failure_loops=None)
    for _ in range(5):
        assert call(BAD)[0] == 422
    assert len(served.bodies) == 5


def test_shadow_mode_only_logs(
    serve: Callable[..., tuple[Call, Served]], fuse: Fuse, caplog: pytest.LogCaptureFixture
) -> None:
    call, served = serve(fuse=fuse, shadow=True)
    with caplog.at_level("WARNING", logger="tokenfuse.middleware"):
        for _ in range(5):
            assert call(BAD)[0] == 422
    assert len(served.bodies) == 5
    assert any("failure_loop" in record.getMessage() for record in caplog.records)


class DeadLoops(MemoryStore):
    """A store whose loop operations fail (the rest works): the breaker fails open."""

    def run(self, op: Any) -> Any:
        if op.name in ("check_loops", "note_loop"):
            raise StoreUnavailable("loop state unreachable")
        return super().run(op)


def test_a_store_failure_fails_open_and_is_reported(
    serve: Callable[..., tuple[Call, Served]], clock: Clock
) -> None:
    events: list[Any] = []
    fuse = inbound_fuse(DeadLoops(clock=clock), bucket=FREE, on_event=events.append)
    call, served = serve(fuse=fuse)
    for _ in range(5):
        assert call(BAD)[0] == 422
    assert len(served.bodies) == 5
    assert [event.kind for event in events][:1] == ["store_unavailable"]


def test_a_wrong_policy_type_is_refused() -> None:
    with pytest.raises(ValueError, match="FailureLoopPolicy"):
        TokenFuseWSGI(lambda environ, start: [], failure_loops=3)  # type: ignore[arg-type]
