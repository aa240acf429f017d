"""Gate before sending, record after the response: what reaches the network and the store."""

from __future__ import annotations

import pickle
from types import ModuleType
from typing import Any

import httpx
import httpx2
import pytest

from tests.conftest import Clock
from tokenfuse import (
    CeilingExceeded,
    ConfigurationError,
    Fuse,
    LoopSuspected,
    MemoryStore,
    StoreUnavailable,
    VelocityPolicy,
    default_fuse,
)
from tokenfuse._transport import AsyncFuseTransport, FuseReport, FuseTransport

from .bodies import CASES
from .conftest import ChunkServer, trained_fuse

CHAT = CASES["openai-chat"]  # 25 tokens
STREAM = CASES["anthropic-stream"]  # 40 tokens


class CountingStore:
    """A MemoryStore that counts the calls a fuse makes to it (round trips, for Redis)."""

    def __init__(self, inner: MemoryStore, fail: bool = False) -> None:
        self.inner = inner
        self.calls: list[str] = []
        self.fail = fail

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        def counted(op: Any) -> Any:
            # one entry per round trip: agate, record, ...; a pipeline's ops joined by "+"
            ops = op if name.endswith("_many") else [op]
            prefix = "a" if name.startswith("arun") else ""
            self.calls.append(prefix + "+".join(each.name for each in ops))
            if self.fail:
                raise StoreUnavailable("redis is down")
            return method(op)

        return counted


def post(client: Any, case: Any = CHAT) -> Any:
    return client.post(case.url, headers=case.request_headers, content=b"{}")


def test_a_runaway_loop_is_refused_before_any_byte_leaves(lib: ModuleType, clock: Clock) -> None:
    fuse = trained_fuse(clock, "agent-1")
    server = ChunkServer(lib, CASES["anthropic-messages"])  # 200 tokens a call
    transport = FuseTransport(server.transport(), fuse=fuse, key="agent-1")
    sent: list[FuseReport] = []

    def loop(client: Any) -> None:
        while len(sent) < 1_000:
            sent.append(post(client, CASES["anthropic-messages"]).extensions["tokenfuse"])

    with lib.Client(transport=transport) as client, pytest.raises(LoopSuspected) as refused:
        loop(client)
    # The call that tripped came back with its (paid for) response; the next one was refused.
    assert sent[-1].tripped
    assert not any(report.tripped for report in sent[:-1])
    # 50 calls of 200 tokens plus the last training minute's 1,000: 11x the 1,000 baseline.
    assert len(server.requests) == len(sent) == 50
    error = refused.value
    assert error.key == "agent-1"
    assert error.baseline == pytest.approx(1_000)
    assert error.multiple is not None
    assert error.multiple >= 10
    assert error.retry_after == pytest.approx(60)
    assert "possible agent loop" in str(error)

    # Refused again, still without sending, until the cooldown has passed.
    with lib.Client(transport=transport) as client, pytest.raises(LoopSuspected):
        post(client, CASES["anthropic-messages"])
    assert len(server.requests) == 50
    clock.advance(61)
    with lib.Client(transport=transport) as client:
        assert post(client, CASES["anthropic-messages"]).status_code == 200
    assert len(server.requests) == 51


async def test_async_runaway_loop_is_refused(lib: ModuleType, clock: Clock) -> None:
    fuse = trained_fuse(clock, "agent-1")
    server = ChunkServer(lib, CASES["anthropic-messages"])
    transport = AsyncFuseTransport(server.transport(), fuse=fuse, key="agent-1")

    async def loop(client: Any) -> None:
        for _ in range(1_000):
            await client.post(CASES["anthropic-messages"].url, content=b"{}")

    async with lib.AsyncClient(transport=transport) as client:
        with pytest.raises(LoopSuspected):
            await loop(client)
    assert len(server.requests) == 50


def test_a_ceiling_trip_raises_ceiling_exceeded(lib: ModuleType, clock: Clock) -> None:
    fuse = Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(limit="60/minute"))
    server = ChunkServer(lib, CHAT)
    with lib.Client(transport=FuseTransport(server.transport(), fuse=fuse)) as client:
        post(client), post(client)
        third = post(client)  # 75 tokens in the window: over 60, trips
        assert third.extensions["tokenfuse"].tripped
        with pytest.raises(CeilingExceeded) as refused:
            post(client)
    assert refused.value.key == "sk-…a1b2"  # the credential, redacted
    assert len(server.requests) == 3


@pytest.mark.parametrize(
    ("case", "round_trips"),
    [
        pytest.param(CHAT, ["gate", "record"], id="counted"),
        pytest.param(STREAM, ["gate", "record"], id="counted-stream"),
        pytest.param(CASES["openai-chat-stream-no-usage"], ["gate"], id="unknown"),
        pytest.param(CASES["anthropic-count-tokens"], ["gate"], id="counts-nothing"),
        pytest.param(CASES["openai-error-429"], ["gate"], id="error"),
    ],
)
@pytest.mark.parametrize("loops", [False, True], ids=["no-loop-breaker", "loop-breaker"])
def test_at_most_two_store_round_trips_per_call(
    lib: ModuleType, clock: Clock, case: Any, round_trips: list[str], loops: bool
) -> None:
    """The velocity fuse's gate and record; the failure-loop breaker's check goes with the gate
    (one pipeline: one round trip; on Redis both are answered by the open-key view), and its
    note, which counts the send (``on_repeat="event"``), with the record; a call that
    records nothing (a 429 is no failure, but a send: ``loop_step``) sends its note alone."""
    store = CountingStore(MemoryStore(clock=clock))
    fuse = Fuse(store)
    options: dict[str, Any] = {} if loops else {"failure_loops": None}
    inner = ChunkServer(lib, case).transport()
    with lib.Client(transport=FuseTransport(inner, fuse=fuse, **options)) as c:
        post(c, case).read()
    expected = round_trips
    if loops:
        after = round_trips[1] + "+note_loop" if len(round_trips) > 1 else "note_loop"
        expected = [round_trips[0] + "+check_loops", after]
    assert store.calls == expected


async def test_async_round_trips(lib: ModuleType, clock: Clock) -> None:
    store = CountingStore(MemoryStore(clock=clock))
    transport = AsyncFuseTransport(ChunkServer(lib, STREAM).transport(), fuse=Fuse(store))
    async with lib.AsyncClient(transport=transport) as client:
        await client.post(STREAM.url, content=b"{}")
    assert store.calls == ["agate+check_loops", "arecord+note_loop"]


def test_the_report_is_in_the_response_extensions(lib: ModuleType, fuse: Fuse) -> None:
    with lib.Client(transport=FuseTransport(ChunkServer(lib, CHAT).transport(), fuse=fuse)) as c:
        post(c)
        report: FuseReport = post(c).extensions["tokenfuse"]
    assert report.key == "sk-…a1b2"
    assert report.gate.allowed
    assert report.usage is not None
    assert (report.usage.input, report.usage.output, report.usage.total) == (19, 6, 25)
    assert report.usage.provider == "openai"
    assert report.record is not None
    assert report.decision is report.record
    assert report.decision.rate == 50
    assert not report.tripped


def test_a_store_outage_fails_open(lib: ModuleType, clock: Clock) -> None:
    store = CountingStore(MemoryStore(clock=clock), fail=True)
    server = ChunkServer(lib, STREAM)
    with lib.Client(transport=FuseTransport(server.transport(), fuse=Fuse(store))) as client:
        for _ in range(5):
            response = post(client, STREAM)
            assert response.content == STREAM.body
            report = response.extensions["tokenfuse"]
            assert report.gate.degraded
    assert len(server.requests) == 5
    assert report.usage.total == 40  # still read, even though it could not be recorded


def test_fail_closed_refuses_at_the_gate_but_never_loses_a_paid_response(
    lib: ModuleType, clock: Clock
) -> None:
    store = CountingStore(MemoryStore(clock=clock))
    fuse = Fuse(store, fail_closed=True)
    server = ChunkServer(lib, STREAM)
    with lib.Client(transport=FuseTransport(server.transport(), fuse=fuse)) as client:
        response = client.send(client.build_request("POST", STREAM.url), stream=True)
        store.fail = True  # the store dies while the stream is being read
        assert response.read() == STREAM.body
        assert response.extensions["tokenfuse"].record is None
        with pytest.raises(StoreUnavailable):
            post(client, STREAM)
    assert len(server.requests) == 1


def test_close_is_delegated_to_the_inner_transport(lib: ModuleType) -> None:
    closed: list[str] = []

    class Inner:
        def handle_request(self, request: Any) -> Any:
            raise AssertionError("not called")

        def close(self) -> None:
            closed.append("closed")

    with lib.Client(transport=FuseTransport(Inner())):
        pass
    assert closed == ["closed"]


async def test_aclose_is_delegated_to_the_inner_transport(lib: ModuleType) -> None:
    closed: list[str] = []

    class Inner:
        async def handle_async_request(self, request: Any) -> Any:
            raise AssertionError("not called")

        async def aclose(self) -> None:
            closed.append("closed")

    async with lib.AsyncClient(transport=AsyncFuseTransport(Inner())):
        pass
    assert closed == ["closed"]


def test_the_default_inner_is_the_clients_own_http_transport(environment: Any) -> None:
    environment({})  # the embedded default, whatever Redis the suite runs against
    transport = FuseTransport()
    assert transport.fuse is default_fuse()
    for lib in (httpx, httpx2):
        with pytest.raises(lib.ConnectError):  # nothing listens on port 9 of loopback
            transport.handle_request(lib.Request("POST", "http://127.0.0.1:9/v1/chat/completions"))
    made = transport._made
    assert isinstance(made["httpx"], httpx.HTTPTransport)
    assert isinstance(made["httpx2"], httpx2.HTTPTransport)
    transport.close()
    assert isinstance(AsyncFuseTransport().fuse.store, MemoryStore)


def test_the_transport_is_not_an_httpx_class_at_run_time() -> None:
    """anthropic 2.x refuses a transport with an ``httpx`` class in its MRO."""
    for kind in (FuseTransport, AsyncFuseTransport):
        assert all(not cls.__module__.startswith("httpx") for cls in kind.__mro__)


def test_requests_of_other_libraries_are_rejected_clearly() -> None:
    class Request:
        pass

    with pytest.raises(TypeError, match="httpx and httpx2"):
        FuseTransport().handle_request(Request())


def test_misconfigured_fuses_are_rejected_at_construction() -> None:
    with pytest.raises(ConfigurationError, match="velocity"):
        FuseTransport(fuse=Fuse(velocity=None))

    class SyncOnly:
        def __getattr__(self, name: str) -> Any:
            if name.startswith("a"):
                raise AttributeError(name)
            return lambda *a, **k: None

    class AsyncOnly:
        def __getattr__(self, name: str) -> Any:
            if not name.startswith("a"):
                raise AttributeError(name)
            return lambda *a, **k: None

    with pytest.raises(ConfigurationError, match="async-only"):
        FuseTransport(fuse=Fuse(AsyncOnly()))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="sync-only"):
        AsyncFuseTransport(fuse=Fuse(SyncOnly()))  # type: ignore[arg-type]


def test_a_refusal_still_pickles_as_the_plain_tokenfuse_error(clock: Clock) -> None:
    import anthropic

    fuse = trained_fuse(clock, "agent-1")
    for _ in range(11):
        fuse.record("agent-1", 1_000)
    server = ChunkServer(httpx2, STREAM)
    with (
        httpx2.Client(transport=FuseTransport(server.transport(), fuse=fuse, key="agent-1")) as c,
        pytest.raises(LoopSuspected) as refused,
    ):
        c.post(STREAM.url, headers={"User-Agent": "Anthropic/Python 2.14.0"}, content=b"{}")
    error = refused.value
    assert isinstance(error, anthropic.AnthropicError)  # so anthropic lets it through as is
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is LoopSuspected
    assert (str(copy), copy.as_dict()) == (str(error), error.as_dict())


async def test_a_sync_transport_in_an_async_client_names_the_async_one(lib: ModuleType) -> None:
    named = r"use AsyncFuseTransport with httpx\.AsyncClient"
    client = lib.AsyncClient(transport=FuseTransport(fuse=Fuse()))
    with pytest.raises(ConfigurationError, match=named):
        await client.post(CHAT.url, content=b"{}")
    await client.aclose()  # closing does not raise again
    with pytest.raises(ConfigurationError, match=named):
        async with lib.AsyncClient(transport=FuseTransport(fuse=Fuse())):
            pass


def test_an_async_transport_in_a_sync_client_names_the_sync_one(lib: ModuleType) -> None:
    client = lib.Client(transport=AsyncFuseTransport(fuse=Fuse()))
    with pytest.raises(ConfigurationError, match=r"use FuseTransport with httpx\.Client"):
        client.post(CHAT.url, content=b"{}")
    client.close()
    with (
        pytest.raises(ConfigurationError, match="AsyncFuseTransport is an async transport"),
        lib.Client(transport=AsyncFuseTransport(fuse=Fuse())),
    ):
        pass
