"""The real openai 3.x and anthropic 2.x clients through the transport.

What the SDKs do with an exception raised inside their transport is checked here too (see
``tokenfuse._transport.refusal``): openai re-raises it as is; anthropic would wrap it in
``APIConnectionError`` and retry, unless it is an ``AnthropicError``, which refusals of its
own requests are (and refusals of any other request are not).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from tests.conftest import Clock
from tokenfuse import Fuse, Identity, LoopSuspected
from tokenfuse._transport import AsyncFuseTransport, FuseTransport, refusal, unwrap_refusals

from .bodies import CASES, Case
from .conftest import chunk_stream, split, trained_fuse

OPENAI_KEY = "sk-proj-sdk-test-0001"
ANTHROPIC_KEY = "sk-ant-api03-sdk-test-0002"
MESSAGES = [{"role": "user", "content": "Say hello"}]


class LLMStub:
    """A fake API (as the inner transport's handler): picks the case the request asks for."""

    def __init__(self, lib: Any = httpx2, *, fail_first: int = 0) -> None:
        self.lib = lib
        self.requests: list[Any] = []
        self.fail_first = fail_first

    def case_for(self, request: Any) -> Case:
        streaming = bool(json.loads(request.content or b"{}").get("stream"))
        if request.url.path.endswith("/v1/messages"):
            return CASES["anthropic-stream" if streaming else "anthropic-messages"]
        return CASES["openai-chat-stream" if streaming else "openai-chat"]

    def __call__(self, request: Any) -> Any:
        self.requests.append(request)
        if len(self.requests) <= self.fail_first:
            return self.lib.Response(529, json={"type": "error", "error": {"type": "overloaded"}})
        case = self.case_for(request)
        headers = {"content-type": case.content_type, "request-id": "req_1"}
        stream = chunk_stream(self.lib, split(case.body, "random"))
        return self.lib.Response(200, headers=headers, stream=stream)


def openai_client(fuse: Fuse, stub: LLMStub, **kw: Any) -> openai.OpenAI:
    transport = FuseTransport(httpx2.MockTransport(stub), fuse=fuse)
    return openai.OpenAI(api_key=OPENAI_KEY, http_client=httpx2.Client(transport=transport), **kw)


def anthropic_client(fuse: Fuse, stub: LLMStub, **kw: Any) -> anthropic.Anthropic:
    transport = FuseTransport(httpx2.MockTransport(stub), fuse=fuse)
    http_client = anthropic.DefaultHttpxClient(transport=transport)  # not refused as "httpx"
    return anthropic.Anthropic(api_key=ANTHROPIC_KEY, http_client=http_client, **kw)


def ask_openai(client: openai.OpenAI) -> str | None:
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES)  # type: ignore[arg-type]
    return reply.choices[0].message.content


def ask_anthropic(client: anthropic.Anthropic) -> str:
    message = client.messages.create(model="claude-sonnet-5-5", max_tokens=64, messages=MESSAGES)  # type: ignore[arg-type]
    return message.content[0].text  # type: ignore[union-attr]


def test_openai_calls_are_counted(fuse: Fuse) -> None:
    stub = LLMStub()
    client = openai_client(fuse, stub)
    assert ask_openai(client) == "Hello there!"
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == 25
    assert fuse.status(Identity.secret(OPENAI_KEY)).rate == 50


def test_anthropic_calls_are_counted(fuse: Fuse) -> None:
    client = anthropic_client(fuse, LLMStub())
    assert ask_anthropic(client) == "Hi!"
    with client.messages.stream(
        model="claude-sonnet-5-5",
        max_tokens=64,
        messages=MESSAGES,  # type: ignore[arg-type]
    ) as stream:
        assert stream.get_final_text() == "Hi!"
    assert fuse.status(Identity.secret(ANTHROPIC_KEY)).rate == 200 + 40


async def test_async_sdks_are_counted(fuse: Fuse) -> None:
    stub = LLMStub()
    transport = AsyncFuseTransport(httpx2.MockTransport(stub), fuse=fuse)
    async with httpx2.AsyncClient(transport=transport) as http_client:
        oa = openai.AsyncOpenAI(api_key=OPENAI_KEY, http_client=http_client)
        reply = await oa.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert reply.usage is not None
        stream = await oa.chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            stream_options={"include_usage": True},
        )
        async for _ in stream:
            pass
        an = anthropic.AsyncAnthropic(api_key=ANTHROPIC_KEY, http_client=http_client)
        await an.messages.create(model="m", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
        async with an.messages.stream(model="m", max_tokens=8, messages=MESSAGES) as events:  # type: ignore[arg-type]
            assert await events.get_final_text() == "Hi!"
    assert fuse.status(Identity.secret(OPENAI_KEY)).rate == 50
    assert fuse.status(Identity.secret(ANTHROPIC_KEY)).rate == 240


def test_openai_over_legacy_httpx_client_is_counted(fuse: Fuse) -> None:
    stub = LLMStub(httpx)
    http_client = httpx.Client(transport=FuseTransport(httpx.MockTransport(stub), fuse=fuse))
    client = openai.OpenAI(api_key=OPENAI_KEY, http_client=http_client)  # type: ignore[arg-type]
    assert ask_openai(client) == "Hello there!"
    assert fuse.status(Identity.secret(OPENAI_KEY)).rate == 25


def openai_agent(fuse: Fuse, stub: LLMStub) -> Callable[[], object]:
    client = openai_client(fuse, stub)
    return lambda: ask_openai(client)


def anthropic_agent(fuse: Fuse, stub: LLMStub) -> Callable[[], object]:
    client = anthropic_client(fuse, stub)
    return lambda: ask_anthropic(client)


Runaway = Callable[[Fuse, LLMStub], Callable[[], object]]
SDKS = [
    pytest.param(openai_agent, OPENAI_KEY, 25, id="openai"),
    pytest.param(anthropic_agent, ANTHROPIC_KEY, 200, id="anthropic"),
]


class Gates:
    """Counts the gate checks of a fuse (one per attempt that reached the transport)."""

    def __init__(self, fuse: Fuse) -> None:
        self.count = 0
        gate, gate_with = fuse.gate, fuse.gate_with

        def counted(who: Any) -> Any:
            self.count += 1
            return gate(who)

        def counted_with(who: Any, ops: Any) -> Any:  # the gate with other steps' operations
            self.count += 1
            return gate_with(who, ops)

        fuse.gate = counted  # type: ignore[method-assign]
        fuse.gate_with = counted_with  # type: ignore[method-assign]


@pytest.mark.parametrize(("make", "key", "per_call"), SDKS)
def test_a_runaway_agent_loop_is_stopped_with_loop_suspected(
    clock: Clock, make: Runaway, key: str, per_call: int
) -> None:
    fuse = trained_fuse(clock, Identity.secret(key), per_minute=400)
    stub = LLMStub()
    ask = make(fuse, stub)
    gates = Gates(fuse)
    answered = 0
    caught: LoopSuspected | None = None
    try:
        while answered < 10_000:  # the agent's bug: it never stops by itself
            ask()
            answered += 1
    except LoopSuspected as exc:  # what agent code writes, with either SDK
        caught = exc
    assert caught is not None
    assert caught.key == Identity.secret(key).label
    assert caught.baseline == 400
    assert len(stub.requests) == answered  # nothing reached the network after the trip
    assert answered * per_call + 400 >= 4_400  # it took a 10x spike to trip
    assert gates.count == answered + 1  # the SDK did not retry the refused call
    # Later calls stay refused, with nothing sent, until the cooldown has passed.
    with pytest.raises(LoopSuspected):
        ask()
    assert len(stub.requests) == answered


async def test_async_runaway_loops_are_stopped(clock: Clock) -> None:
    fuse = trained_fuse(clock, Identity.secret(ANTHROPIC_KEY), per_minute=400)
    stub = LLMStub()
    transport = AsyncFuseTransport(httpx2.MockTransport(stub), fuse=fuse)
    client = anthropic.AsyncAnthropic(
        api_key=ANTHROPIC_KEY, http_client=anthropic.DefaultAsyncHttpxClient(transport=transport)
    )

    async def loop() -> None:
        for _ in range(1_000):
            async with client.messages.stream(model="m", max_tokens=8, messages=MESSAGES) as s:  # type: ignore[arg-type]
                await s.get_final_text()

    with pytest.raises(LoopSuspected):
        await loop()
    # 100 streams of 40 tokens: 4,000 tokens/min = 10x the baseline, even without the window's
    # largest call (the last training minute's 400).
    assert len(stub.requests) == 100


def test_sdk_retries_of_server_errors_spend_only_the_answered_call(fuse: Fuse) -> None:
    stub = LLMStub(fail_first=2)  # overloaded twice, then an answer
    client = anthropic_client(fuse, stub, max_retries=2)
    client._calculate_retry_timeout = lambda *a, **k: 0.0  # type: ignore[method-assign]
    assert ask_anthropic(client) == "Hi!"
    assert len(stub.requests) == 3
    assert fuse.status(Identity.secret(ANTHROPIC_KEY)).rate == 200


def test_an_sdk_that_wraps_and_retries_spends_nothing_and_can_be_unwrapped(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What openai 1.x, groq and anthropic (for non-SDK errors) do: wrap, retry, re-raise."""
    monkeypatch.setattr(refusal, "_PASS_THROUGH", ())  # as if the refusal were a plain error
    fuse = trained_fuse(clock, Identity.secret(ANTHROPIC_KEY), per_minute=400)
    for _ in range(11):
        fuse.record(Identity.secret(ANTHROPIC_KEY), 400)
    stub = LLMStub()
    client = anthropic_client(fuse, stub, max_retries=2)
    client._calculate_retry_timeout = lambda *a, **k: 0.0  # type: ignore[method-assign]
    gates = Gates(fuse)
    with pytest.raises(anthropic.APIConnectionError) as wrapped:
        ask_anthropic(client)
    assert gates.count == 3  # the SDK tried three times...
    assert stub.requests == []  # ...and every retry was refused before sending
    assert isinstance(wrapped.value.__cause__, LoopSuspected)
    with pytest.raises(LoopSuspected), unwrap_refusals():
        ask_anthropic(client)


def test_without_the_transport_the_sdk_hides_a_transport_error(fuse: Fuse) -> None:
    """The finding the refusal design rests on, checked against the installed anthropic."""

    class Raising:
        def handle_request(self, request: Any) -> Any:
            raise ValueError("from the transport")

        def close(self) -> None:
            pass

    client = anthropic.Anthropic(
        api_key=ANTHROPIC_KEY, http_client=httpx2.Client(transport=Raising()), max_retries=0
    )
    with pytest.raises(anthropic.APIConnectionError) as wrapped:
        ask_anthropic(client)
    assert isinstance(wrapped.value.__cause__, ValueError)

    oa = openai.OpenAI(api_key=OPENAI_KEY, http_client=httpx2.Client(transport=Raising()))
    with pytest.raises(ValueError, match="from the transport"):
        ask_openai(oa)  # openai 3.x: as it is, and not retried


def refused_openai_call(clock: Clock) -> BaseException:
    fuse = trained_fuse(clock, Identity.secret(OPENAI_KEY), per_minute=400)
    for _ in range(11):
        fuse.record(Identity.secret(OPENAI_KEY), 400)
    client = openai_client(fuse, LLMStub())
    try:
        ask_openai(client)
    except anthropic.AnthropicError:  # an openai agent's fallback for a Claude backup, say
        pytest.fail("an AnthropicError handler caught a refusal of an openai call")
    except LoopSuspected as exc:
        return exc
    pytest.fail("the call was not refused")


def test_an_openai_refusal_is_the_plain_tokenfuse_error(clock: Clock) -> None:
    assert type(refused_openai_call(clock)) is LoopSuspected


def test_only_the_anthropic_sdk_gets_the_anthropic_compatible_refusal() -> None:
    seen: list[Any] = []

    def keep(request: Any) -> Any:
        seen.append(request)
        return httpx2.Response(200, json={})

    transport = httpx2.MockTransport(keep)
    for client in (
        anthropic.Anthropic(api_key=ANTHROPIC_KEY, http_client=httpx2.Client(transport=transport)),
        openai.OpenAI(api_key=OPENAI_KEY, http_client=httpx2.Client(transport=transport)),
    ):
        client.get("/v1/models", cast_to=object)
    from_anthropic, from_openai = (request.headers for request in seen)
    assert refusal.through_anthropic_sdk(from_anthropic)
    assert not refusal.through_anthropic_sdk(from_openai)
    assert not refusal.through_anthropic_sdk(httpx2.Headers({"anthropic-version": "2023-06-01"}))
    # The SDK's own headers tell, even when the user agent was replaced.
    custom = httpx2.Headers({**from_anthropic, "user-agent": "my-agent/1.0"})
    assert refusal.through_anthropic_sdk(custom)
    # openai's SDK sent to an Anthropic-compatible endpoint is still openai's.
    compatible = httpx2.Headers({**from_openai, "anthropic-version": "2023-06-01"})
    assert not refusal.through_anthropic_sdk(compatible)
