"""The failure-loop breaker in the transport, with the real openai 3.x and anthropic 2.x SDKs.

The inner transport is a stub API that answers every request with an error (or a stream that
carries one); the SDKs raise their own errors for those, and after the third failure of the
same call the next one is refused with ``FailureLoop`` before a byte leaves: the stub counts
what reached it. Both stores (the embedded one and the real Redis), the simulated clock.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from tests.conftest import Clock
from tokenfuse import Fuse, FuseTripped, Identity, MemoryStore, StoreUnavailable
from tokenfuse._transport import (
    AsyncFuseTransport,
    FailureLoop,
    FailureLoopPolicy,
    FuseTransport,
    aforget_loops,
    forget_loops,
)
from tokenfuse.events import FuseEvent

from .conftest import chunk_stream, split

OPENAI_KEY = "sk-proj-loop-test-0001"
ANTHROPIC_KEY = "sk-ant-api03-loop-test-0002"
SECRET = "a test secret, at least 32 characters long"
MESSAGES = [{"role": "user", "content": "Say hello"}]
CHAT_OK = {
    "id": "c1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-4o-mini",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}
OPENAI_400 = {"error": {"type": "invalid_request_error", "message": "bad 'x' sk-proj-secret"}}
ANTHROPIC_400 = {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}


class Stub:
    """A fake API: answers ``status`` with ``body`` (or 200 with CHAT_OK), counts requests."""

    def __init__(self, status: int = 400, body: Any = OPENAI_400) -> None:
        self.status = status
        self.body = body
        self.requests: list[Any] = []

    def __call__(self, request: Any) -> Any:
        self.requests.append(request)
        if self.status >= 400:
            return httpx2.Response(self.status, json=self.body)
        return httpx2.Response(200, json=CHAT_OK)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def fuse(request: pytest.FixtureRequest, clock: Clock) -> Iterator[Fuse]:
    if request.param == "memory":
        yield Fuse(MemoryStore(clock=clock), secret=SECRET)
        return
    from tokenfuse.stores import RedisStore

    url = request.getfixturevalue("redis_url")
    prefix = request.getfixturevalue("redis_prefix")
    store = RedisStore.from_url(url, prefix=prefix, clock=clock)
    yield Fuse(store, secret=SECRET)
    store.close()


def openai_client(fuse: Fuse, stub: Stub, **options: Any) -> openai.OpenAI:
    transport = FuseTransport(httpx2.MockTransport(stub), fuse=fuse, **options)
    http_client = httpx2.Client(transport=transport)
    return openai.OpenAI(api_key=OPENAI_KEY, http_client=http_client, max_retries=0)


def anthropic_client(fuse: Fuse, stub: Stub, **options: Any) -> anthropic.Anthropic:
    transport = FuseTransport(httpx2.MockTransport(stub), fuse=fuse, **options)
    http_client = anthropic.DefaultHttpxClient(transport=transport)
    return anthropic.Anthropic(api_key=ANTHROPIC_KEY, http_client=http_client, max_retries=0)


def ask_openai(client: openai.OpenAI, messages: Any = MESSAGES) -> Any:
    return client.chat.completions.create(model="gpt-4o-mini", messages=messages)


def ask_anthropic(client: anthropic.Anthropic, messages: Any = MESSAGES) -> Any:
    return client.messages.create(model="claude-sonnet-5-5", max_tokens=64, messages=messages)


def test_openai_the_fourth_same_failing_call_raises_failure_loop(fuse: Fuse) -> None:
    stub = Stub()
    client = openai_client(fuse, stub)
    for _ in range(3):
        with pytest.raises(openai.BadRequestError):
            ask_openai(client)
    with pytest.raises(FailureLoop) as caught:
        ask_openai(client)
    assert len(stub.requests) == 3  # refused before a byte left
    loop = caught.value
    assert type(loop) is FailureLoop and isinstance(loop, FuseTripped)
    assert loop.reason == "failure_loop" and loop.count == 3 and loop.window == 120
    assert loop.call.startswith("POST /v1/chat/completions #") and loop.fingerprint
    assert (loop.status, loop.error) == (400, "invalid_request_error")
    assert 0 < loop.retry_after <= 120
    message = str(loop)
    assert "failed 3 times over 2 min" in message and "HTTP 400 invalid_request_error" in message
    assert "forget_loops" in message
    assert "sk-proj-loop" not in message and "Say hello" not in message  # no key, no body
    assert "sk-proj-secret" not in message  # nor the error's message


def test_anthropic_raises_failure_loop_unwrapped_and_unretried(fuse: Fuse) -> None:
    stub = Stub(body=ANTHROPIC_400)
    transport = FuseTransport(httpx2.MockTransport(stub), fuse=fuse)
    http_client = anthropic.DefaultHttpxClient(transport=transport)
    client = anthropic.Anthropic(api_key=ANTHROPIC_KEY, http_client=http_client)  # retries on
    for _ in range(3):
        with pytest.raises(anthropic.BadRequestError):
            ask_anthropic(client)
    caught: list[FailureLoop] = []
    try:
        ask_anthropic(client)
    except FailureLoop as loop:  # what user code writes
        caught.append(loop)
    assert len(caught) == 1
    assert caught[0].call.startswith("POST /v1/messages #")
    assert caught[0].error == "invalid_request_error"
    assert len(stub.requests) == 3  # neither sent nor retried


def test_another_call_still_goes_and_forget_loops_lets_it_through(fuse: Fuse) -> None:
    stub = Stub()
    client = openai_client(fuse, stub)
    for _ in range(3):
        with pytest.raises(openai.BadRequestError):
            ask_openai(client)
    with pytest.raises(openai.BadRequestError):  # other arguments: progress, not the loop
        ask_openai(client, [{"role": "user", "content": "Say hello, differently"}])
    with pytest.raises(FailureLoop) as caught:
        ask_openai(client)
    assert forget_loops(caught.value, fuse=fuse) == 1  # this very call
    with pytest.raises(openai.BadRequestError):
        ask_openai(client)
    assert forget_loops(Identity.secret(OPENAI_KEY), fuse=fuse) == 2  # every call of the key
    assert len(stub.requests) == 5
    assert caught.value.store_key and OPENAI_KEY not in caught.value.store_key


def test_after_the_cooldown_the_call_goes_again(fuse: Fuse, clock: Clock) -> None:
    stub = Stub(status=500, body={"error": {"type": "server_error"}})
    client = openai_client(fuse, stub, failure_loops=FailureLoopPolicy(cooldown=30))
    for _ in range(3):
        with pytest.raises(openai.InternalServerError):
            ask_openai(client)
    clock.advance(29)
    with pytest.raises(FailureLoop):
        ask_openai(client)
    clock.advance(1)
    stub.status = 200
    assert ask_openai(client).choices[0].message.content == "Hi"


def test_failures_further_apart_than_the_window_never_trip(fuse: Fuse, clock: Clock) -> None:
    stub = Stub()
    client = openai_client(fuse, stub)
    for _ in range(6):
        with pytest.raises(openai.BadRequestError):
            ask_openai(client)
        clock.advance(61)  # at most two failures in any 120 s
    assert len(stub.requests) == 6


def test_a_success_ends_the_count(fuse: Fuse) -> None:
    stub = Stub()
    client = openai_client(fuse, stub)
    for status in (400, 400, 200, 400, 400):
        stub.status = status
        if status == 200:
            ask_openai(client)
        else:
            with pytest.raises(openai.BadRequestError):
                ask_openai(client)
    assert len(stub.requests) == 5  # never three failures in a row


def test_rate_limits_are_not_failures(fuse: Fuse) -> None:
    stub = Stub(status=429, body={"error": {"type": "rate_limit_exceeded"}})
    client = openai_client(fuse, stub)
    for _ in range(4):
        with pytest.raises(openai.RateLimitError):
            ask_openai(client)
    assert len(stub.requests) == 4


def test_an_error_object_in_a_200_body_is_a_failure(fuse: Fuse) -> None:
    def handler(request: Any) -> Any:
        return httpx.Response(200, json={"error": {"code": "tool_failed"}})

    with httpx.Client(transport=FuseTransport(httpx.MockTransport(handler), fuse=fuse)) as c:
        for _ in range(3):
            c.post("https://api.example.com/run", json={"a": 1})
        with pytest.raises(FailureLoop) as caught:
            c.post("https://api.example.com/run", json={"a": 1})
    assert caught.value.error == "tool_failed" and caught.value.status is None


@pytest.mark.parametrize("lib", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_an_error_event_in_a_stream_is_a_failure(fuse: Fuse, lib: Any) -> None:
    body = (
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
        b'{"input_tokens":3,"output_tokens":1}}}\n\n'
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n'
    )
    requests = []

    def handler(request: Any) -> Any:
        requests.append(request)
        stream = chunk_stream(lib, split(body, "random"))
        return lib.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    transport = FuseTransport(lib.MockTransport(handler), fuse=fuse)
    with lib.Client(transport=transport) as client:
        for _ in range(3):
            with client.stream("POST", "https://api.anthropic.com/v1/messages", json={}) as r:
                r.read()
        with pytest.raises(FailureLoop) as caught:
            client.post("https://api.anthropic.com/v1/messages", json={})
    assert len(requests) == 3 and caught.value.error == "stream_error"


@pytest.mark.parametrize("error", [True, False], ids=["an error event", "none"])
def test_an_error_event_past_the_head_of_an_event_stream_read_already_is_found(
    fuse: Fuse, error: bool
) -> None:
    """A response whose event stream was read before the transport saw it (an inner
    transport that buffers) is looked at whole: its error event is found however far past
    the head kept for an error object it comes, and one without is no failure."""
    from tokenfuse._transport import loop_step

    events = b'data: {"choices":[{"delta":{"content":"fine"}}]}\n\n'
    body = events * (loop_step._HEAD // len(events) + 10)
    if error:
        body += b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n'
    headers = {"content-type": "text/event-stream"}
    requests = []

    def handler(request: Any) -> Any:
        requests.append(request)
        return httpx2.Response(200, headers=headers, content=body)  # read already

    url = "https://api.anthropic.com/v1/messages"
    transport = FuseTransport(httpx2.MockTransport(handler), fuse=fuse)
    with httpx2.Client(transport=transport) as client:
        for _ in range(3):
            client.post(url, json={})
        if not error:
            client.post(url, json={})
            assert len(requests) == 4
            return
        with pytest.raises(FailureLoop) as caught:
            client.post(url, json={})
    assert len(requests) == 3 and caught.value.error == "stream_error"


def test_anthropic_sdk_stream_errors_trip(fuse: Fuse) -> None:
    body = b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error"}}\n\n'

    def handler(request: Any) -> Any:
        stream = chunk_stream(httpx2, [body])
        headers = {"content-type": "text/event-stream"}
        return httpx2.Response(200, headers=headers, stream=stream)

    transport = FuseTransport(httpx2.MockTransport(handler), fuse=fuse)
    http_client = anthropic.DefaultHttpxClient(transport=transport)
    client = anthropic.Anthropic(api_key=ANTHROPIC_KEY, http_client=http_client, max_retries=0)
    for _ in range(3):
        with (
            pytest.raises(anthropic.APIStatusError),
            client.messages.stream(
                model="claude-sonnet-5-5", max_tokens=64, messages=MESSAGES
            ) as stream,
        ):
            stream.get_final_text()
    with pytest.raises(FailureLoop):
        ask_anthropic(client)


async def test_async_openai_raises_failure_loop(fuse: Fuse) -> None:
    stub = Stub()
    transport = AsyncFuseTransport(httpx2.MockTransport(stub), fuse=fuse)
    async with httpx2.AsyncClient(transport=transport) as http_client:
        client = openai.AsyncOpenAI(api_key=OPENAI_KEY, http_client=http_client, max_retries=0)
        for _ in range(3):
            with pytest.raises(openai.BadRequestError):
                await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)  # type: ignore[arg-type]
        with pytest.raises(FailureLoop):
            await client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)  # type: ignore[arg-type]
        assert await aforget_loops(Identity.secret(OPENAI_KEY), fuse=fuse) == 1
    assert len(stub.requests) == 3
    aclose = getattr(fuse.store, "aclose", None)
    if aclose is not None:  # the asyncio client this test made lives on this test's loop
        await aclose()


def test_events_and_the_trip_is_reported(fuse: Fuse) -> None:
    seen: list[FuseEvent] = []
    fuse.on_event(seen.append)
    client = openai_client(fuse, Stub())
    for _ in range(3):
        with pytest.raises(openai.BadRequestError):
            ask_openai(client)
    loops = [event for event in seen if event.kind == "failure_loop"]
    assert len(loops) == 1 and isinstance(loops[0].error, FailureLoop)
    assert loops[0].key_id == fuse.key_id(Identity.secret(OPENAI_KEY))


# -- repeats -----------------------------------------------------------------------------------


def test_five_identical_successes_are_reported_not_refused(fuse: Fuse) -> None:
    seen: list[FuseEvent] = []
    fuse.on_event(seen.append)
    stub = Stub(status=200)
    client = openai_client(fuse, stub)
    for _ in range(7):
        ask_openai(client)
    repeats = [event for event in seen if event.kind == "repeat_loop"]
    assert len(repeats) == 1 and "sent 5 times" in repeats[0].detail
    assert len(stub.requests) == 7


def test_repeats_are_refused_when_configured(fuse: Fuse, clock: Clock) -> None:
    stub = Stub(status=200)
    client = openai_client(fuse, stub, failure_loops=FailureLoopPolicy(on_repeat="refuse"))
    for _ in range(4):
        ask_openai(client)
        clock.advance(5)
    with pytest.raises(FailureLoop) as caught:
        ask_openai(client)
    assert caught.value.reason == "repeat_loop" and caught.value.count == 5
    assert "sent 5 times over 60 s" in str(caught.value)
    clock.advance(45)
    ask_openai(client)  # the window has passed
    assert len(stub.requests) == 5


# -- tool-call loops in the request history ----------------------------------------------------


def openai_tool_turn(n: int, city: str, result: str) -> list[dict[str, Any]]:
    arguments = json.dumps({"city": city})
    function = {"name": "weather", "arguments": arguments}
    call = {"id": f"call_{n}", "type": "function", "function": function}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{n}", "content": result},
    ]


def test_openai_history_with_the_same_failing_tool_call_three_times_is_refused(
    fuse: Fuse,
) -> None:
    stub = Stub(status=200)
    client = openai_client(fuse, stub)
    history: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    for n in range(2):
        history += openai_tool_turn(n, "Paris", "Error: upstream timeout")
    ask_openai(client, history)  # twice: not yet a loop
    history += openai_tool_turn(2, "Paris", "Error: upstream timeout")
    with pytest.raises(FailureLoop) as caught:
        ask_openai(client, history)
    assert len(stub.requests) == 1
    loop = caught.value
    assert loop.reason == "tool_loop" and loop.tool == "weather" and loop.count == 3
    assert "upstream timeout" not in str(loop)  # the tool's text is never shown


def test_a_tool_call_that_succeeded_last_is_no_loop(fuse: Fuse) -> None:
    stub = Stub(status=200)
    client = openai_client(fuse, stub)
    history: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    for n in range(4):
        history += openai_tool_turn(n, "Paris", "Error: upstream timeout")
    history += openai_tool_turn(9, "Paris", '{"temperature": 12}')
    ask_openai(client, history)
    history = history[:1] + [
        message for n in range(4) for message in openai_tool_turn(n, f"city-{n}", "Error: no")
    ]
    ask_openai(client, history)  # other arguments each time: the agent is trying things
    assert len(stub.requests) == 2


def test_anthropic_history_alternating_two_failing_tools_is_refused(fuse: Fuse) -> None:
    stub = Stub(status=200)
    client = anthropic_client(fuse, stub)
    history: list[Any] = [{"role": "user", "content": "book it"}]
    for n, (tool, data) in enumerate([("search", {"q": "x"}), ("book", {"id": 7})] * 2):
        use = {"type": "tool_use", "id": f"t{n}", "name": tool, "input": data}
        result = {"type": "tool_result", "tool_use_id": f"t{n}", "is_error": True, "content": "no"}
        history += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    with pytest.raises(FailureLoop) as caught:
        ask_anthropic(client, history)
    assert caught.value.reason == "tool_loop" and caught.value.tool == "search/book"
    assert caught.value.count == 4 and not stub.requests


def test_responses_api_history_is_read_too(fuse: Fuse) -> None:
    stub = Stub(status=200)
    client = openai_client(fuse, stub)
    items: list[Any] = [{"role": "user", "content": "go"}]
    for n in range(3):
        items.append({"type": "function_call", "call_id": f"c{n}", "name": "run", "arguments": ""})
        items.append({"type": "function_call_output", "call_id": f"c{n}", "output": '{"error": 1}'})
    with pytest.raises(FailureLoop) as caught:
        client.responses.create(model="gpt-4o-mini", input=items)
    assert caught.value.tool == "run" and not stub.requests


# -- what must never happen: a crash, or a silent guard ----------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"not json \xff",
        b"[1, 2]",
        b"[" * 50_000 + b"]" * 50_000,
        json.dumps({"messages": "x", "input": 5}).encode(),
        json.dumps({"messages": [{"role": "assistant", "tool_calls": 5}, 3, None]}).encode(),
        json.dumps({"messages": [{"role": "tool", "tool_call_id": [], "content": {}}]}).encode(),
        json.dumps({"input": [{"type": "function_call", "call_id": {}, "arguments": 5}]}).encode(),
        b'{"a": "' + b"x" * (2 << 20) + b'"}',
    ],
)
def test_bad_bodies_never_break_a_call(fuse: Fuse, body: bytes) -> None:
    def handler(request: Any) -> Any:
        return httpx.Response(200, json=CHAT_OK)

    with httpx.Client(transport=FuseTransport(httpx.MockTransport(handler), fuse=fuse)) as c:
        assert c.post("https://api.openai.com/v1/chat/completions", content=body).json()


class BrokenStore:
    """A store that is down: every operation raises ``StoreUnavailable``."""

    def run(self, op: Any) -> Any:
        raise StoreUnavailable("redis is down")

    async def arun(self, op: Any) -> Any:
        raise StoreUnavailable("redis is down")


def test_a_store_outage_fails_open_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    fuse = Fuse(BrokenStore(), secret=SECRET)  # type: ignore[arg-type]
    seen: list[FuseEvent] = []
    fuse.on_event(seen.append)
    stub = Stub()
    client = openai_client(fuse, stub)
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        for _ in range(5):
            with pytest.raises(openai.BadRequestError):
                ask_openai(client)
    assert len(stub.requests) == 5  # nothing refused: failed open
    assert any(event.kind == "store_unavailable" for event in seen)
    assert any("store_unavailable" in record.getMessage() for record in caplog.records)


def test_fail_closed_refuses_before_sending() -> None:
    fuse = Fuse(BrokenStore(), secret=SECRET, velocity=None, fail_closed=True)  # type: ignore[arg-type]
    from tokenfuse._loops import LoopBreaker  # the breaker alone, without a velocity gate

    breaker = LoopBreaker(fuse, FailureLoopPolicy())
    call = breaker.name("POST", "h", "/p", b"{}")
    with pytest.raises(StoreUnavailable):
        breaker.check(Identity.named("agent"), call)


def test_shadow_mode_lets_the_loop_through_and_logs_it(
    fuse: Fuse, caplog: pytest.LogCaptureFixture
) -> None:
    stub = Stub()
    client = openai_client(fuse, stub, shadow=True)
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        for _ in range(5):
            with pytest.raises(openai.BadRequestError):
                ask_openai(client)
    assert len(stub.requests) == 5
    assert any("would refuse" in record.getMessage() for record in caplog.records)


def test_off_with_none(fuse: Fuse) -> None:
    stub = Stub()
    client = openai_client(fuse, stub, failure_loops=None)
    for _ in range(6):
        with pytest.raises(openai.BadRequestError):
            ask_openai(client)
    assert len(stub.requests) == 6


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"failures": 1}, "failures"),
        ({"window": -1}, "window must"),
        ({"on_repeat": "ignore"}, "on_repeat"),
        ({"tool_failures": 0}, "tool_failures"),
        ({"max_calls": 0}, "max_calls"),
    ],
)
def test_bad_policies_fail_at_construction(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FailureLoopPolicy(**options)


def test_a_wrong_policy_type_is_refused() -> None:
    with pytest.raises(ValueError, match="FailureLoopPolicy"):
        FuseTransport(failure_loops={"failures": 3})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "body",
    [
        b'data: {"choices":[]}\n\nevent: error\ndata: {"message":"overloaded"}\n\n',
        b'data: {"choices":[]}\n\ndata: {"error": {"message": "boom"}}\n\n',
        b'data: {"type":"response.failed","response":{}}\n\n',
    ],
)
def test_an_error_mark_split_across_chunks_anywhere_is_found(body: bytes) -> None:
    from tokenfuse._loops import CallName
    from tokenfuse._transport.loop_step import LoopWatch

    for cut in range(1, len(body)):
        watch = LoopWatch(Identity.named("a"), CallName("0" * 16, "POST", "/"), False)
        watch.feed(body[:cut])
        watch.feed(body[cut:])
        assert watch.marked, cut
    rng = random.Random(7)  # and in pieces of any size, a few bytes each included
    for _ in range(500):
        cuts = sorted(rng.sample(range(1, len(body)), rng.randint(2, 12)))
        watch = LoopWatch(Identity.named("a"), CallName("0" * 16, "POST", "/"), False)
        for start, end in zip([0, *cuts], [*cuts, len(body)], strict=True):
            watch.feed(body[start:end])
        assert watch.marked, cuts
    clean = LoopWatch(Identity.named("a"), CallName("0" * 16, "POST", "/"), False)
    for part in (b'data: {"text":"an err', b'or in the text is no error event"}\n\n'):
        clean.feed(part)
    assert not clean.marked


def test_the_meters_stream_feeds_one_watch_and_ends_it_after_settling() -> None:
    """The watch rides in the meter's stream (one generator); a second one, as a nested
    transport's would be, is turned away (it wraps the stream instead) and the first kept."""
    from types import SimpleNamespace

    from tokenfuse._transport.stream import MeteredStream

    class Meter:  # what MeteredStream asks of a meter: what to show the chunks to
        report = SimpleNamespace(done=False)  # settled only at the end

        def stream_reader(self) -> Any:
            return seen.append

    seen: list[bytes] = []
    watched: list[bytes] = []
    steps: list[str] = []
    stream = MeteredStream(
        iter([b"a", b"b"]),  # type: ignore[arg-type]
        Meter(),  # type: ignore[arg-type]
        lambda meter, complete: steps.append(f"settled {complete}"),
    )
    assert stream.attach(watched.append, lambda: steps.append("noted"))
    assert not stream.attach(lambda chunk: None, lambda: steps.append("other"))
    assert list(stream) == [b"a", b"b"]
    # Both are shown the same batch (the chunks joined), before the settle.
    assert seen == watched == [b"ab"] and steps == ["settled True", "noted"]


def _watched_stream(kind: Any, inner: Any, steps: list[str]) -> Any:
    """A metered stream of ``kind`` over ``inner`` with a watch attached: each step (the
    settle, the watch's end) written down in ``steps``."""
    from types import SimpleNamespace

    class Meter:
        def __init__(self) -> None:
            self.report = SimpleNamespace(done=False)

        def stream_reader(self) -> Any:
            return lambda chunk: None

    meter = Meter()

    def settle(meter: Any, complete: bool) -> None:
        meter.report.done = True
        steps.append(f"settled {complete}")

    async def asettle(meter: Any, complete: bool) -> None:
        settle(meter, complete)

    async def anoted() -> None:
        steps.append("noted")

    is_async = kind.__name__.startswith("Async")
    stream = kind(inner, meter, asettle if is_async else settle)
    assert stream.attach(lambda chunk: None, anoted if is_async else lambda: steps.append("noted"))
    return stream


def test_the_meters_stream_ends_its_watch_once() -> None:
    """httpx closes every stream it read to the end: the watch is ended at the end, and the
    close that follows ends it no more (its note was taken once; a second end costs a call
    that has nothing to say). A stream closed before its end is ended by the close."""
    from tokenfuse._transport.stream import MeteredStream

    class Inner:  # a library's stream: chunks, and a close
        def __init__(self, chunks: list[bytes]) -> None:
            self.chunks = chunks

        def __iter__(self) -> Any:
            return iter(self.chunks)

        def close(self) -> None:
            pass

    steps: list[str] = []
    read = _watched_stream(MeteredStream, Inner([b"a", b"b"]), steps)
    assert list(read) == [b"a", b"b"]
    read.close()
    assert steps == ["settled True", "noted"]

    steps.clear()
    unread = _watched_stream(MeteredStream, Inner([b"a"]), steps)
    unread.close()
    unread.close()
    assert steps == ["settled False", "noted"]


async def test_the_async_meters_stream_ends_its_watch_once() -> None:
    from tokenfuse._transport.stream import AsyncMeteredStream

    async def chunks() -> Any:
        for chunk in (b"a", b"b"):
            yield chunk

    steps: list[str] = []
    read = _watched_stream(AsyncMeteredStream, chunks(), steps)
    assert [chunk async for chunk in read] == [b"a", b"b"]
    await read.aclose()
    assert steps == ["settled True", "noted"]

    steps.clear()
    unread = _watched_stream(AsyncMeteredStream, chunks(), steps)
    await unread.aclose()
    await unread.aclose()
    assert steps == ["settled False", "noted"]


def test_an_error_mark_across_the_border_of_two_batches_is_found() -> None:
    """Chunks are searched a batch (``_BATCH`` bytes) at a time: a mark that ends in one batch
    and began in the previous one is found, wherever the border falls in it."""
    from tokenfuse._loops import CallName
    from tokenfuse._transport import loop_step
    from tokenfuse._transport.loop_step import LoopWatch

    for event, mark in (
        (b"event: error\ndata: {}\n\n", b"event: error"),
        (b'data: {"type":"response.failed"}\n\n', b'"type":"response.failed"'),
        (b'data: {"error": {"message": "boom"}}\n\n', b'data: {"error"'),
    ):
        at = event.index(mark)
        for inside in range(1, len(mark)):  # this many bytes of the mark in the first batch
            filler = b"x" * (loop_step._BATCH - at - inside)
            watch = LoopWatch(Identity.named("a"), CallName("0" * 16, "POST", "/"), False)
            for chunk in (filler, event[: at + inside], event[at + inside :]):
                watch.find(chunk)
            assert watch.marked, (mark, inside)
    clean = LoopWatch(Identity.named("a"), CallName("0" * 16, "POST", "/"), False)
    for _ in range(3 * loop_step._BATCH // 40):
        clean.find(b'data: {"delta": "an error-free chunk"}\n\n')
    assert not clean.marked


@pytest.mark.parametrize("lib", [httpx, httpx2], ids=["httpx", "httpx2"])
async def test_async_streams_are_watched_too(fuse: Fuse, lib: Any) -> None:
    body = b'data: {"choices":[]}\n\ndata: {"error": {"type": "server_error"}}\n\n'
    sent = []

    async def chunks() -> Any:
        for part in split(body, "random"):
            yield part

    class Stream(lib.AsyncByteStream):  # type: ignore[misc, name-defined]
        def __aiter__(self) -> Any:
            return chunks()

    def handler(request: Any) -> Any:
        sent.append(request)
        return lib.Response(200, headers={"content-type": "text/event-stream"}, stream=Stream())

    transport = AsyncFuseTransport(lib.MockTransport(handler), fuse=fuse)
    url = "https://api.openai.com/v1/chat/completions"
    async with lib.AsyncClient(transport=transport) as client:
        for _ in range(3):
            async with client.stream("POST", url, json={}) as response:
                await response.aread()
        with pytest.raises(FailureLoop) as caught:
            await client.post(url, json={})
    assert len(sent) == 3 and caught.value.error == "stream_error"
    aclose = getattr(fuse.store, "aclose", None)
    if aclose is not None:
        await aclose()


def test_sdk_retries_are_checked_but_their_failures_not_counted_again(fuse: Fuse) -> None:
    def failing(request: Any) -> Any:
        return httpx.Response(500, json={"error": {"type": "server_error"}})

    url = "https://api.openai.com/v1/chat/completions"
    body = {"model": "m", "messages": MESSAGES}
    with httpx.Client(transport=FuseTransport(httpx.MockTransport(failing), fuse=fuse)) as c:

        def attempt(retry: int) -> int:
            headers = {"x-stainless-retry-count": str(retry)}
            return c.post(url, json=body, headers=headers).status_code

        assert [attempt(n) for n in (0, 1, 2)] == [500] * 3  # one call, tried three times
        assert [attempt(n) for n in (0, 1, 2)] == [500] * 3  # two failures so far
        assert attempt(0) == 500  # the third call's first try: the third failure trips
        with pytest.raises(FailureLoop):
            attempt(1)  # its retry is refused before it leaves


def test_a_tool_loop_refused_again_and_again_is_reported_once_a_minute(fuse: Fuse) -> None:
    seen: list[FuseEvent] = []
    fuse.on_event(seen.append)
    client = openai_client(fuse, Stub(status=200))
    history: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    for n in range(3):
        history += openai_tool_turn(n, "Paris", "Error: upstream timeout")
    for _ in range(5):
        with pytest.raises(FailureLoop):
            ask_openai(client, history)
    assert [event.kind for event in seen] == ["failure_loop"]


def test_a_failure_loop_survives_pickling(fuse: Fuse) -> None:
    import pickle

    client = openai_client(fuse, Stub())
    for _ in range(3):
        with pytest.raises(openai.BadRequestError):
            ask_openai(client)
    with pytest.raises(FailureLoop) as caught:
        ask_openai(client)
    copy = pickle.loads(pickle.dumps(caught.value))
    assert type(copy) is FailureLoop and str(copy) == str(caught.value)
    assert (copy.call, copy.count, copy.store_key) == (
        caught.value.call,
        caught.value.count,
        caught.value.store_key,
    )


def _watch_of_marks() -> Any:
    from tokenfuse._loops import CallName
    from tokenfuse._transport.loop_step import LoopWatch

    return LoopWatch(Identity.named("a"), CallName("0" * 16, "POST", "/"), False)


@pytest.mark.parametrize("big", [True, False], ids=["batch-sized pieces", "small chunks"])
def test_a_mark_across_the_seam_of_two_pieces_is_found_at_every_offset(big: bool) -> None:
    """A piece as big as a batch (the metered stream's) is searched where it lies, and the
    seam with the piece before it apart; small chunks are batched first. Either way a mark
    split anywhere across the border of two pieces is found, and a word that only looks like
    one is not."""
    from tokenfuse._transport import loop_step

    size = loop_step._BATCH if big else 40  # each piece's length, the mark's part included
    for mark in loop_step._STREAM_ERRORS:
        for inside in range(1, len(mark)):  # this many bytes of the mark in the first piece
            first = b"x" * (size - inside) + mark[:inside]
            second = mark[inside:] + b"y" * (size - len(mark) + inside)
            watch = _watch_of_marks()
            watch.find(first)
            watch.find(second)
            assert watch.marked, (mark, inside)
            clean = _watch_of_marks()  # the same border, the mark's last byte changed
            clean.find(first)
            clean.find(second[: len(mark) - inside - 1] + b"!" + second[len(mark) - inside :])
            assert not clean.marked, (mark, inside)


@pytest.mark.parametrize("size", [8, 100, 8 * 1024, 40 * 1024])
def test_a_mark_wholly_inside_a_piece_is_found_and_none_is_not(size: int) -> None:
    marked, clean = _watch_of_marks(), _watch_of_marks()
    for at in range(4):
        piece = b'data: {"delta": "an error-free chunk"}\n\n' * (size // 40 + 1)
        marked.find(piece[:size] if at < 3 else b'data: {"error": {}}\n\n' + piece[:size])
        clean.find(piece[:size])
    assert marked.marked
    assert not clean.marked


def test_marked_answers_after_each_partial_feed() -> None:
    """``marked`` searches the chunks put aside so far, and the search goes on after it: a
    mark split across a chunk it searched and the next is still found."""
    from tokenfuse._transport import loop_step

    watch = _watch_of_marks()
    watch.find(b"data: {}\n\nevent: er")  # small: put aside
    assert not watch.marked
    watch.find(b"ror\n")  # the mark's end, seamed to what ``marked`` searched
    assert watch.marked
    big = _watch_of_marks()
    big.find(b"x" * loop_step._BATCH + b'data: {"err')
    assert not big.marked
    big.find(b'or"')
    assert big.marked
    assert big.marked  # asked again: no more to search, the answer kept


def _long_stream_with_an_error(where: str) -> list[bytes]:
    """Several batches of events whose text says "error", one error event among them."""
    from tokenfuse._transport.stream import BATCH

    text = b'data: {"choices":[{"delta":{"content":"an error-free chunk"}}],"usage":null}\n\n'
    events = [text] * (3 * BATCH // len(text))
    error = b'data: {"error": {"type": "server_error", "message": "boom"}}\n\n'
    events.insert({"first": 3, "middle": len(events) // 2, "last": len(events)}[where], error)
    return events


def _searches_asked(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The batches ``ErrorFind`` is asked about, in order (recorded)."""
    from tokenfuse._usage.scan import ErrorFind

    asked: list[bytes] = []
    at = ErrorFind.at

    def recorded(self: ErrorFind, data: bytes) -> int:
        asked.append(data)
        return at(self, data)

    monkeypatch.setattr(ErrorFind, "at", recorded)
    return asked


def _assert_searched_once_for_both(asked: list[bytes], where: str) -> None:
    # Each batch (three a stream, three streams) searched once: asked by the reader, then by
    # the watch until it found the error event (no search after that).
    runs = [1]
    for before, data in itertools.pairwise(asked):
        if data is before:
            runs[-1] += 1
        else:
            runs.append(1)
    assert len(runs) == 3 * 3 and set(runs) == ({2} if where == "last" else {1, 2}), runs


URL = "https://api.openai.com/v1/chat/completions"


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_an_error_in_a_long_stream_is_seen_by_the_reader_and_the_watch(
    fuse: Fuse, lib: Any, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream of several batches whose text says "error" everywhere, with one error event
    in its first, a middle or its last batch: the usage reader reads it (the usage says so)
    and the watch counts the failure (the fourth call is refused), while each batch is
    searched for "error" once for both (the reader's search, shared with the watch)."""
    asked = _searches_asked(monkeypatch)
    events = _long_stream_with_an_error(where)

    def handler(request: Any) -> Any:
        stream = chunk_stream(lib, events)
        return lib.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    with lib.Client(transport=FuseTransport(lib.MockTransport(handler), fuse=fuse)) as client:
        for _ in range(3):
            with client.stream("POST", URL, json={"stream": True}) as response:
                response.read()
            usage = response.extensions["tokenfuse"].usage
            assert usage.partial and usage.problem == "error reported in stream", usage
        with pytest.raises(FailureLoop) as caught:
            client.post(URL, json={})
    assert caught.value.error == "stream_error"
    _assert_searched_once_for_both(asked, where)


@pytest.mark.parametrize("where", ["first", "last"])
async def test_async_an_error_in_a_long_stream_is_seen_by_the_reader_and_the_watch(
    fuse: Fuse, lib: Any, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = _searches_asked(monkeypatch)
    events = _long_stream_with_an_error(where)

    def handler(request: Any) -> Any:
        stream = chunk_stream(lib, events)
        return lib.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    transport = AsyncFuseTransport(lib.MockTransport(handler), fuse=fuse)
    async with lib.AsyncClient(transport=transport) as client:
        for _ in range(3):
            async with client.stream("POST", URL, json={"stream": True}) as response:
                await response.aread()
            usage = response.extensions["tokenfuse"].usage
            assert usage.partial and usage.problem == "error reported in stream", usage
        with pytest.raises(FailureLoop) as caught:
            await client.post(URL, json={})
    assert caught.value.error == "stream_error"
    _assert_searched_once_for_both(asked, where)
    aclose = getattr(fuse.store, "aclose", None)
    if aclose is not None:
        await aclose()


@pytest.mark.parametrize("lib", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_the_endpoint_read_once_names_calls_as_each_step_would(lib: Any) -> None:
    """The transport reads a request's host and path once (``endpoint_of``) for the loop
    check and the meter: the call's fingerprint and its usage reader are the ones each step
    finds when it reads the URL itself."""
    from tokenfuse._fuse import Decision
    from tokenfuse._transport.compat import endpoint_of
    from tokenfuse._transport.loop_step import LoopStep
    from tokenfuse._transport.meter import Metering
    from tokenfuse._transport.refusal import Gatekeeper
    from tokenfuse._transport.usage_option import Sending

    fuse = Fuse(MemoryStore())
    step = LoopStep(fuse, FailureLoopPolicy(), Gatekeeper(False))
    metering = Metering(fuse, None, True)
    who = Identity.named("a")
    gate = Decision(key="a", allowed=True)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    usage = b'{"usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}'
    for url, provider in (
        ("https://api.openai.com/v1/chat/completions?api-version=1", "openai"),
        ("https://API.Anthropic.com/v1/messages", "anthropic"),
        ("http://127.0.0.1:8000/v1/chat/completions", "openai-compatible"),
        ("http://localhost:11434", "generic"),
        ("https://münchen.example/v1/models/a%20b:generateContent?alt=sse", "gemini"),
    ):
        request = lib.Request("POST", url, content=body.encode())
        where = endpoint_of(request.url)
        assert where is not None
        once, itself = step.prepare(who, request, where), step.prepare(who, request)
        assert once is not None and itself is not None
        assert (once.call.fingerprint, once.call.path) == (
            itself.call.fingerprint,
            itself.call.path,
        )
        usages = []
        for at in (where, None):
            response = lib.Response(
                200, headers={"content-type": "application/json"}, content=usage
            )
            meter = metering.start(Sending(request, request), response, who, gate, at)
            meter.finish(complete=True)
            usages.append(meter.report.usage)
        assert usages[0] == usages[1] and usages[0] is not None, url
        assert usages[0].provider == provider, url  # the reader of the host and path
        assert where[1] == request.url.raw_path.decode("ascii").partition("?")[0]
