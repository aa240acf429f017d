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
from tokenfuse import FREE, BucketPolicy, Fuse, MemoryStore, StoreUnavailable
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
        self.down = False  # every call answers 503, whatever its arguments


def lookup(served: Served, body: bytes) -> tuple[int, dict[str, Any]]:
    served.bodies.append(body)
    if served.down:
        return 503, {"error": "the tool's backend is down"}
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
GOOD = json.dumps({"id": 7}).encode()


class Counted:
    """A store (memory or Redis) whose round trips are logged: each call to it, a pipeline's
    operations joined by "+", with how many requests the app had been given by then."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.served = Served()
        self.trips: list[tuple[str, int]] = []

    def _log(self, ops: Any) -> None:
        self.trips.append(("+".join(op.name for op in ops), len(self.served.bodies)))

    def run(self, op: Any) -> Any:
        self._log([op])
        return self.inner.run(op)

    async def arun(self, op: Any) -> Any:
        self._log([op])
        return await self.inner.arun(op)

    def run_many(self, ops: Any) -> Any:
        self._log(ops)
        return self.inner.run_many(ops)

    async def arun_many(self, ops: Any) -> Any:
        self._log(ops)
        return await self.inner.arun_many(ops)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def taken(self) -> list[tuple[str, int]]:
        trips, self.trips = self.trips, []
        return trips


def before_app(fuse: Fuse) -> str:
    """What goes to the store before the app: the admission and the loop check in one
    pipeline; on Redis, once its open-key view is synced, the admission alone, as the view
    answers the check (``RedisStore.known``). The view is waited for: the test is exact."""
    view = getattr(fuse.store, "open_keys", None)
    if view is None:
        return "admit+check_loops"
    assert view.wait_synced(5)
    return "admit"


def counted(fuse: Fuse, **options: Any) -> tuple[Fuse, Counted]:
    store = Counted(fuse.store)
    options = {"bucket": FREE, **options}
    return Fuse(store, name="inbound", velocity=CALL_VELOCITY, secret=SECRET, **options), store


def test_one_round_trip_before_the_app_and_one_after_only_for_a_failure(
    serve: Callable[..., tuple[Call, Served]], fuse: Fuse
) -> None:
    """The admission and the failure-loop check go in one pipeline: one round trip before
    the app (on Redis, the admission alone: the open-key view answers the check), one after
    it for an error, none after a plain success."""
    guarded, store = counted(fuse)
    call, store.served = serve(fuse=guarded)
    check = before_app(fuse)

    assert call(GOOD)[0] == 200
    assert store.taken() == [(check, 0)]  # before the app; nothing to note after a success
    for served in (1, 2, 3):
        assert call(BAD)[0] == 422
        assert store.taken() == [(check, served), ("note_loop", served + 1)]
    status, body = call(BAD)
    assert (status, body["type"]) == (429, "failure_loop")
    assert store.taken() == [(check, 4)]  # refused on the pipeline's verdict: the app not called
    assert store.served.bodies == [GOOD] + [BAD] * 3


def test_a_request_the_bucket_refuses_is_still_counted_as_a_send(
    serve: Callable[..., tuple[Call, Served]], fuse: Fuse, clock: Clock
) -> None:
    """The store runs the admission and the check together: a request the bucket refuses is
    refused for its quota (one round trip, the app not called), and its call was counted as
    sent, which only ``on_repeat="refuse"`` acts on (as documented in loops.py)."""
    guarded, store = counted(fuse, bucket=BucketPolicy(rate=1, capacity=2))
    policy = FailureLoopPolicy(repeats=3, on_repeat="refuse")
    call, store.served = serve(fuse=guarded, failure_loops=policy)

    assert [call(GOOD)[0] for _ in range(2)] == [200, 200]
    status, body = call(GOOD)  # the third send of the call: refused by the bucket first
    assert (status, body["type"]) == (429, "quota_exhausted")
    assert store.taken()[-1] == ("admit+check_loops", 2)
    clock.advance(5)  # the bucket refills; the repeat window (60 s) has not passed
    status, body = call(GOOD)
    assert (status, body["type"]) == (429, "repeat_loop")
    assert len(store.served.bodies) == 2


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


def test_a_success_ends_the_failures_of_its_call(
    serve: Callable[..., tuple[Call, Served]], fuse: Fuse
) -> None:
    """A success of a call that has failed is noted (a round trip after the app), and ends
    its failures: two failures, a success, then two more never trip. A success of a call
    with no failures notes nothing."""
    guarded, store = counted(fuse)
    call, store.served = serve(fuse=guarded)
    served = store.served
    check = before_app(fuse)

    assert call(GOOD)[0] == 200
    assert store.taken() == [(check, 0)]  # no failures to end: no note
    served.down = True
    assert [call(GOOD)[0] for _ in range(2)] == [503, 503]
    served.down = False
    assert call(GOOD)[0] == 200
    assert store.taken()[-1] == ("note_loop", 4)  # the success ends the two failures
    served.down = True
    assert [call(GOOD)[0] for _ in range(2)] == [503, 503]  # two failures, not four: no trip
    assert len(served.bodies) == 6


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

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.failed = 0

    def run(self, op: Any) -> Any:
        if op.name in ("check_loops", "note_loop"):
            self.failed += 1
            raise StoreUnavailable("loop state unreachable")
        return super().run(op)


def test_a_store_failure_fails_open_and_is_reported(
    serve: Callable[..., tuple[Call, Served]], clock: Clock
) -> None:
    events: list[Any] = []
    dead = DeadLoops(clock=clock)
    fuse = inbound_fuse(dead, bucket=FREE, on_event=events.append)
    call, served = serve(fuse=fuse)
    assert call(BAD)[0] == 422
    # The pipeline failed once (its loop check), failing the admission open with it: one
    # failure counted for both, then the note after the app.
    assert (dead.failed, fuse.health.counts.failed) == (2, 2)
    assert call(BAD)[0] == 422
    for _ in range(3):  # the back-off: the store is skipped, and every request goes ahead
        assert call(BAD)[0] == 422
    assert len(served.bodies) == 5
    assert [event.kind for event in events][:1] == ["store_unavailable"]


def test_a_wrong_policy_type_is_refused() -> None:
    with pytest.raises(ValueError, match="FailureLoopPolicy"):
        TokenFuseWSGI(lambda environ, start: [], failure_loops=3)  # type: ignore[arg-type]


def test_a_bodiless_call_s_check_is_made_once_per_caller_and_route_and_bounded() -> None:
    """The name (fingerprint, shown path) and the operation of a call without a body are kept
    per caller, route and query, for at most ``NAMES_KEPT`` of them; they are the ones made
    anew (``name``, ``LoopBreaker.check_op``). A call with a body is named anew each time."""
    from tokenfuse._middleware.loops import NAMES_KEPT, InboundLoops
    from tokenfuse._middleware.request import AsgiRequest

    loops = InboundLoops(Fuse(MemoryStore(), secret=SECRET), FailureLoopPolicy())
    alice, bob = Identity.of("alice"), Identity.of("bob")

    def prepare(path: str, query: bytes, who: Identity = alice, body: bytes | None = None) -> Any:
        return loops.prepare(who, AsgiRequest({"method": "POST", "path": path}), query, body)

    first = prepare("/tools/a", b"x=1&y=2")
    again = prepare("/tools/a", b"x=1&y=2")
    assert (again.call, again.op) == (first.call, first.op) and again is not first
    assert again.call is first.call and again.op is first.op  # kept, not made again
    request = AsgiRequest({"method": "POST", "path": "/tools/a"})
    made = loops.breaker.check_op(alice, loops.name(request, b"x=1&y=2", None), local=True)
    assert (first.call, first.op) == (loops.name(request, b"x=1&y=2", None), made)
    assert prepare("/tools/a", b"y=2&x=1").op == first.op  # the same arguments
    assert prepare("/tools/a", b"x=2").call.fingerprint != first.call.fingerprint
    by_bob = prepare("/tools/a", b"x=1&y=2", bob)
    assert by_bob.call == first.call and by_bob.op.key != first.op.key
    with_body = prepare("/tools/a", b"x=1&y=2", body=b"{}")
    assert with_body.call is not prepare("/tools/a", b"x=1&y=2", body=b"{}").call
    assert with_body.call.fingerprint != first.call.fingerprint
    for at in range(NAMES_KEPT + 10):
        prepare(f"/items/{at}", b"")
    assert loops._bodiless.cache_info().currsize == NAMES_KEPT
    assert prepare("/tools/a", b"x=1&y=2").op == first.op  # made again, the same


class KnownLoopsFailingAdmits(MemoryStore):
    """A store whose view answers every loop check (``known``, as ``RedisStore``'s synced
    open-key view does) and whose admissions fail."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.asked = 0

    def known(self, op: Any) -> Any:
        from tokenfuse._core.loops import LoopVerdict

        if op.name != "check_loops" or not op.local:
            return None
        self.asked += 1
        return LoopVerdict()

    def run(self, op: Any) -> Any:
        if op.name == "admit":
            raise StoreUnavailable("the admission's store call failed")
        return super().run(op)

    async def arun(self, op: Any) -> Any:
        return self.run(op)


def test_a_failed_admission_drops_the_view_s_loop_verdict(
    serve: Callable[..., tuple[Call, Served]], clock: Clock
) -> None:
    """The admission goes alone when the store's view answers the loop check; when that
    admission fails (open), the view's verdict is dropped as a failed pipeline's is: the call
    goes unchecked for loops, and no loop decision is counted for it."""
    from tokenfuse._fuse import Decision
    from tokenfuse._observe import install

    seen: list[tuple[str, Decision]] = []

    class Watcher:
        def decided(self, fuse: Fuse, op: Any, decision: Decision, seconds: float) -> None:
            seen.append((op.name, decision))

        def store_failed(self, fuse: Fuse, op: Any, error: Exception) -> None:
            pass

    store = KnownLoopsFailingAdmits(clock=clock)
    fuse = inbound_fuse(store, bucket=FREE)
    remove = install(Watcher())
    try:
        call, served = serve(fuse=fuse)
        assert call(GOOD)[0] == 200
    finally:
        remove()
    assert store.asked == 1 and len(served.bodies) == 1
    assert [(name, decision.degraded) for name, decision in seen] == [("admit", True)]
