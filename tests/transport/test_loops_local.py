"""The failure-loop check with no round trip, and the send counted after the call.

With ``on_repeat="event"`` (the default) the transport's check only asks "is this call
tripped?" (``CheckLoops.local``: ``RedisStore`` answers it from its open-key view) and the
call's note counts its send, with its record: in the same pipeline inline, in the recorder's
batch in the background. These tests hold the three stores a transport meets (MemoryStore,
RedisStore with a synced view, RedisStore without one) to the same counts: each send counted
exactly once, each failure once, a trip refusing the next call of this process at once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest
import redis

from tests.conftest import Clock
from tokenfuse import Fuse, Identity, MemoryStore
from tokenfuse._core.loops import LoopCall, LoopState
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_codec import loop_state, loops_key_of
from tokenfuse._transport import AsyncFuseTransport, FailureLoop, FailureLoopPolicy, FuseTransport
from tokenfuse.events import FuseEvent

from .test_failure_loops import MESSAGES, OPENAI_KEY, SECRET, Stub, ask_openai

WAIT = 10.0


class Guarded:
    """A fuse on one of the three stores, and how to read the loop state it keeps."""

    def __init__(self, kind: str, clock: Clock, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.client: redis.Redis | None = None
        if kind == "memory":
            self.store: Any = MemoryStore(clock=clock)
        else:
            url = request.getfixturevalue("redis_url")
            prefix = request.getfixturevalue("redis_prefix")
            self.store = RedisStore.from_url(
                url, prefix=prefix, clock=clock, open_keys=kind == "redis-view"
            )
            self.client = redis.Redis.from_url(url)
            if kind == "redis-view":
                assert self.store.open_keys.wait_synced(WAIT)
        self.fuse = Fuse(self.store, secret=SECRET)

    def calls(self) -> list[LoopCall]:
        """The loop state of the OpenAI key's identity, as the store holds it."""
        key = self.fuse._key(Identity.secret(OPENAI_KEY))
        if self.client is None:
            state = self.store.loop_state(key) or LoopState()
        else:
            state = loop_state(self.client.get(loops_key_of(self.store.prefix, key)))
        return state.calls

    def round_trips(self) -> int:
        """Loop checks the open-key view left to the store (0 without a view)."""
        view = getattr(self.store, "open_keys", None)
        return view.counts.loop_round_trips if view is not None else 0

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.store.close()


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis-view", marks=pytest.mark.redis),
        pytest.param("redis-no-view", marks=pytest.mark.redis),
    ]
)
def guarded(request: pytest.FixtureRequest, clock: Clock) -> Iterator[Guarded]:
    made = Guarded(request.param, clock, request)
    yield made
    made.close()


def client_of(guarded: Guarded, stub: Stub, **options: Any) -> tuple[openai.OpenAI, FuseTransport]:
    transport = FuseTransport(httpx2.MockTransport(stub), fuse=guarded.fuse, **options)
    http_client = httpx2.Client(transport=transport)
    return openai.OpenAI(api_key=OPENAI_KEY, http_client=http_client, max_retries=0), transport


def flushed(transport: FuseTransport) -> None:
    recorder = transport._recorder
    assert recorder is None or recorder.flush()


@pytest.mark.parametrize("record", ["inline", "background"])
@pytest.mark.parametrize("on_repeat", ["event", "refuse"])
def test_each_send_is_counted_exactly_once(
    guarded: Guarded, record: str, on_repeat: str, clock: Clock
) -> None:
    """By the note after the call ("event") or by the check before it ("refuse"): never both,
    never neither, whichever store answers the check."""
    policy = FailureLoopPolicy(on_repeat=on_repeat, repeats=10)  # type: ignore[arg-type]
    client, transport = client_of(guarded, Stub(status=200), record=record, failure_loops=policy)
    for _ in range(4):
        ask_openai(client)
        clock.advance(1)
    flushed(transport)
    [call] = guarded.calls()
    assert call.sends == 4 and call.failures == 0
    transport.close()


@pytest.mark.parametrize("record", ["inline", "background"])
def test_a_looping_call_is_tripped_and_refused_by_the_local_check(
    guarded: Guarded, record: str
) -> None:
    """Three failures trip the call (noted after each call, batched or not); the fourth is
    refused before it leaves, on a synced view with no round trip: the view marked this
    process's trip the moment the note's verdict came back, no announcement awaited."""
    stub = Stub()
    client, transport = client_of(guarded, stub, record=record)
    for _ in range(3):
        with pytest.raises(openai.BadRequestError):
            ask_openai(client)
        flushed(transport)  # the batch sent: its trip is known in this process at once
    with pytest.raises(FailureLoop) as caught:
        ask_openai(client)
    assert caught.value.reason == "failure_loop" and caught.value.count == 3
    assert len(stub.requests) == 3
    [call] = guarded.calls()
    assert (call.sends, call.failures) == (3, 3)  # the refused call was no send
    if guarded.kind == "redis-view":
        assert guarded.round_trips() == 0  # every check answered by the view
        assert guarded.store.open_keys.counts.loop_local == 4
    transport.close()


@pytest.mark.redis
def test_a_batched_trip_refuses_the_next_call_with_no_round_trip(
    redis_url: str, redis_prefix: str, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The background recorder's batch trips the call; the very next call of this process is
    refused by the view: no operation of it reaches Redis (each op sent is encoded by the
    store's ``_args``, counted here), and the view counts no loop round trip."""
    store = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock)
    assert store.open_keys is not None and store.open_keys.wait_synced(WAIT)
    fuse = Fuse(store, secret=SECRET)
    stub = Stub()
    transport = FuseTransport(httpx2.MockTransport(stub), fuse=fuse, record="background")
    client = openai.OpenAI(
        api_key=OPENAI_KEY, http_client=httpx2.Client(transport=transport), max_retries=0
    )
    for _ in range(3):
        with pytest.raises(openai.BadRequestError):
            ask_openai(client)
    assert transport._recorder is not None and transport._recorder.flush()
    sent: list[str] = []
    encode = store._args

    def counted(op: Any) -> Any:
        sent.append(op.name)
        return encode(op)

    monkeypatch.setattr(store, "_args", counted)
    with pytest.raises(FailureLoop):
        ask_openai(client)
    assert sent == []  # the gate and the loop check both answered by the view
    assert store.open_keys.counts.loop_round_trips == 0
    assert len(stub.requests) == 3
    transport.close()
    store.close()


@pytest.mark.parametrize("record", ["inline", "background"])
def test_a_repeat_loop_is_reported_after_the_call_it_let_through(
    guarded: Guarded, record: str
) -> None:
    seen: list[FuseEvent] = []
    guarded.fuse.on_event(seen.append)
    stub = Stub(status=200)
    client, transport = client_of(guarded, stub, record=record)
    for _ in range(7):
        ask_openai(client)
    flushed(transport)
    repeats = [event for event in seen if event.kind == "repeat_loop"]
    assert len(repeats) == 1 and "sent 5 times" in repeats[0].detail
    assert isinstance(repeats[0].error, FailureLoop) and repeats[0].error.count == 5
    assert len(stub.requests) == 7  # reported, never refused
    transport.close()


def test_a_note_that_trips_and_repeats_reports_both(clock: Clock) -> None:
    """Three sends, three failures: the third note trips the call and makes a repeat loop."""
    fuse = Fuse(MemoryStore(clock=clock), secret=SECRET)
    seen: list[FuseEvent] = []
    fuse.on_event(seen.append)
    policy = FailureLoopPolicy(failures=3, repeats=3)
    transport = FuseTransport(httpx2.MockTransport(Stub()), fuse=fuse, failure_loops=policy)
    client = openai.OpenAI(
        api_key=OPENAI_KEY, http_client=httpx2.Client(transport=transport), max_retries=0
    )
    for _ in range(3):
        with pytest.raises(openai.BadRequestError):
            ask_openai(client)
    assert [event.kind for event in seen] == ["failure_loop", "repeat_loop"]
    repeat = seen[1].error
    assert isinstance(repeat, FailureLoop) and repeat.reason == "repeat_loop"
    assert (repeat.count, repeat.window) == (3, 60)


def test_sdk_retries_count_as_sends_but_not_as_failures(guarded: Guarded) -> None:
    def failing(request: Any) -> Any:
        return httpx2.Response(500, json={"error": {"type": "server_error"}})

    url = "https://api.openai.com/v1/chat/completions"
    body = {"model": "m", "messages": MESSAGES}
    transport = FuseTransport(httpx2.MockTransport(failing), fuse=guarded.fuse)
    with httpx2.Client(transport=transport, headers={"authorization": f"Bearer {OPENAI_KEY}"}) as c:
        for retry in (0, 1, 2):  # one call, tried three times by its SDK
            headers = {"x-stainless-retry-count": str(retry)}
            assert c.post(url, json=body, headers=headers).status_code == 500
    [call] = guarded.calls()
    assert (call.sends, call.failures) == (3, 1)


@pytest.mark.parametrize("why", ["full", "dead"])
def test_a_recorder_that_cannot_take_the_note_sends_it_inline_and_counts_it(
    clock: Clock, why: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fuse = Fuse(MemoryStore(clock=clock), secret=SECRET)
    stub = Stub()
    transport = FuseTransport(httpx2.MockTransport(stub), fuse=fuse, record="background")
    recorder = transport._recorder
    assert recorder is not None
    if why == "full":
        recorder.max_pending = 0
    else:

        def refuse(self: threading.Thread) -> None:
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(threading.Thread, "start", refuse)
    client = openai.OpenAI(
        api_key=OPENAI_KEY, http_client=httpx2.Client(transport=transport), max_retries=0
    )
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            with pytest.raises(openai.BadRequestError):
                ask_openai(client)
        with pytest.raises(FailureLoop):  # tripped by the notes sent on the caller's path
            ask_openai(client)
    assert recorder.counts.inline == 3  # each failing call's note: nothing to record with it
    assert "recording on the caller's path" in caplog.text
    key = fuse._key(Identity.secret(OPENAI_KEY))
    state = fuse.store.loop_state(key)  # type: ignore[attr-defined]
    assert state is not None and [(c.sends, c.failures) for c in state.calls] == [(3, 3)]


async def test_async_background_notes_trip_the_call(clock: Clock) -> None:
    fuse = Fuse(MemoryStore(clock=clock), secret=SECRET)
    stub = Stub()
    transport = AsyncFuseTransport(httpx2.MockTransport(stub), fuse=fuse, record="background")
    client = openai.AsyncOpenAI(
        api_key=OPENAI_KEY, http_client=httpx2.AsyncClient(transport=transport), max_retries=0
    )
    for _ in range(3):
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
        assert transport._recorder is not None and transport._recorder.flush()
    with pytest.raises(FailureLoop):
        await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)
    assert len(stub.requests) == 3
    await transport.aclose()


def test_a_send_that_raises_still_counts_as_a_send(guarded: Guarded) -> None:
    """A connection error is no failure of the call (no response), but it was sent."""

    def unreachable(request: Any) -> Any:
        raise httpx2.ConnectError("connection refused")

    client, transport = client_of(guarded, Stub())
    transport._inner = httpx2.MockTransport(unreachable)
    for _ in range(2):
        with pytest.raises(openai.APIConnectionError):
            ask_openai(client)
    [call] = guarded.calls()
    assert (call.sends, call.failures) == (2, 0)
    transport.close()
