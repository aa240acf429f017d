"""Calls whose usage was not reported: estimated, counted in ``fuse.stats``, reported at a pace.

And the drill of issue 8: a looping agent whose streams report no usage is stopped all the same.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from types import ModuleType
from typing import Any

import httpx2
import openai
import pytest

from tests.conftest import Clock
from tokenfuse import Fuse, LoopSuspected, MemoryStore, VelocityPolicy
from tokenfuse._transport import FuseReport, FuseTransport
from tokenfuse.events import FuseEvent
from tokenfuse.fuse import FuseStats, Identity, UsageCounts

from .bodies import CASES
from .conftest import ChunkServer
from .llm_server import LLMServer

ANTHROPIC = CASES["anthropic-stream"]
NO_USAGE = CASES["openai-chat-stream-no-usage"]
# Up to the end of message_start: input 25 and output 1 were reported, the rest never came.
FIRST_EVENT = ANTHROPIC.body[: ANTHROPIC.body.index(b"\n\n") + 2]
REQUEST = json.dumps(
    {"model": "m", "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
).encode()


class Events(list[FuseEvent]):
    """A hook that keeps the events a fuse emits."""

    def __call__(self, event: FuseEvent) -> None:
        self.append(event)

    def kinds(self) -> list[str]:
        return [event.kind for event in self]


def fuse_on(clock: Clock) -> tuple[Fuse, Events]:
    events = Events()
    fuse = Fuse(MemoryStore(clock=clock), on_event=events)
    fuse.stats = FuseStats(clock=clock)
    return fuse, events


def closed_early(lib: ModuleType, transport: Any, key: str) -> FuseReport:
    """An Anthropic stream that the application stops reading after its first event."""
    with (
        lib.Client(transport=transport) as client,
        client.stream("POST", ANTHROPIC.url, headers={"x-api-key": key}) as response,
    ):
        seen = b""
        for chunk in response.iter_raw():
            seen += chunk
            if seen == FIRST_EVENT:
                break
    report: FuseReport = response.extensions["tokenfuse"]
    return report


def no_usage(lib: ModuleType, transport: Any, key: str) -> FuseReport:
    with lib.Client(transport=transport) as client:
        response = client.post(NO_USAGE.url, headers={"x-api-key": key}, content=REQUEST)
    report: FuseReport = response.extensions["tokenfuse"]
    return report


def test_each_kind_is_counted_per_process_and_per_key(lib: ModuleType, clock: Clock) -> None:
    fuse, _ = fuse_on(clock)
    partial = FuseTransport(ChunkServer(lib, ANTHROPIC, how="bytes").transport(), fuse=fuse)
    estimating = FuseTransport(
        ChunkServer(lib, NO_USAGE).transport(), fuse=fuse, inject_usage=False
    )
    blind = FuseTransport(
        ChunkServer(lib, NO_USAGE).transport(), fuse=fuse, inject_usage=False, estimate=False
    )
    closed_early(lib, partial, "sk-ant-key-one")
    no_usage(lib, estimating, "sk-key-one")
    no_usage(lib, estimating, "sk-key-two")
    no_usage(lib, blind, "sk-key-two")
    assert fuse.stats.usage == UsageCounts(estimated=2, unknown=1, partial=1)
    assert fuse.stats.usage_of(Identity.secret("sk-key-two")) == UsageCounts(1, 1, 0)
    assert fuse.stats.usage_of(Identity.secret("sk-ant-key-one")) == UsageCounts(0, 0, 1)
    assert fuse.stats.usage_of("never-seen") == UsageCounts()


def test_reports_come_at_once_then_at_most_once_a_minute_with_the_count(
    lib: ModuleType, clock: Clock
) -> None:
    fuse, events = fuse_on(clock)
    transport = FuseTransport(ChunkServer(lib, NO_USAGE).transport(), fuse=fuse, inject_usage=False)
    for _ in range(3):
        no_usage(lib, transport, "sk-key-one")
    assert events.kinds() == ["usage_estimated"]  # the first at once, not one per call
    assert "(1 so far, 1 since the last report)" in events[0].detail
    clock.advance(61)
    no_usage(lib, transport, "sk-key-one")
    assert events.kinds() == ["usage_estimated"] * 2
    assert "(4 so far, 3 since the last report)" in events[1].detail
    assert events[1].key == Identity.secret("sk-key-one").label
    assert "4 bytes of text a token" in events[1].detail


def test_per_key_counts_are_bounded(clock: Clock) -> None:
    stats = FuseStats(max_keys=2, clock=clock)
    for name in ("a", "b", "a", "c"):
        stats.count(Identity.named(name), "unknown")
    assert stats.usage.unknown == 4
    assert stats.usage_of("a").unknown == 2  # counted again after b: kept
    assert stats.usage_of("b") == UsageCounts()  # the least recently counted: dropped
    assert stats.usage_of("c").unknown == 1


@pytest.mark.parametrize("estimate", [True, False])
def test_a_partial_but_counted_stream_is_not_called_unknown(
    lib: ModuleType, clock: Clock, estimate: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 14: streams closed before message_stop were logged as 'recorded as unknown'."""
    caplog.set_level(logging.INFO, logger="tokenfuse")
    fuse, events = fuse_on(clock)
    server = ChunkServer(lib, ANTHROPIC, how="bytes")
    report = closed_early(lib, FuseTransport(server.transport(), fuse=fuse, estimate=estimate), "k")
    assert report.usage is not None
    assert (report.usage.total, report.usage.partial, report.usage.estimated) == (26, True, False)
    assert fuse.status(report.identity).rate == 26
    assert events.kinds() == ["usage_partial"]
    [record] = [r for r in caplog.records if r.name == "tokenfuse"]
    assert record.levelno == logging.INFO
    message = record.getMessage()
    assert "recorded as far as they reported (26 tokens for the latest)" in message
    assert "unknown" not in message
    assert "nothing" not in message


# -- the drill: a loop of streams that report no usage ------------------------------------------


# Arms on the baseline that estimated calls teach it (about 40 tokens a call, a call a minute).
POLICY = VelocityPolicy(learning_period=0, min_samples=3, min_baseline=20)
WARM_UP = 15  # minutes of normal pace: a minute is learned once it leaves the 10-minute window
TASK = [
    {"role": "system", "content": "You are a coding agent. Use the tools to finish the task."},
    {"role": "user", "content": "Find the failing test in the repository and fix it."},
]


def streaming_agent(server: LLMServer, transport: FuseTransport, key: str) -> Callable[..., str]:
    client = openai.OpenAI(
        api_key=key,
        base_url=server.url.removesuffix("/chat/completions"),
        http_client=httpx2.Client(transport=transport),
        max_retries=0,
    )

    def ask(messages: list[dict[str, str]]) -> str:
        stream = client.chat.completions.create(
            model="stub",
            messages=messages,  # type: ignore[arg-type]
            stream=True,
            extra_body={"chunks": 20},
        )
        return "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)

    return ask


class Recorded:
    """The amounts a fuse records, added up (what tokenfuse counted, against what was billed)."""

    def __init__(self, fuse: Fuse) -> None:
        self.total = 0.0
        record, record_with = fuse.record, fuse.record_with

        def counted(who: Any, amount: float) -> Any:
            self.total += amount
            return record(who, amount)

        def counted_with(who: Any, amount: float, ops: Any) -> Any:  # with the loop note
            self.total += amount
            return record_with(who, amount, ops)

        fuse.record = counted  # type: ignore[method-assign]
        fuse.record_with = counted_with  # type: ignore[method-assign]


LOOPS = [
    pytest.param({}, "asked", id="usage-asked"),
    pytest.param({"inject_usage": False}, "estimated", id="estimated"),
    pytest.param({"inject_usage": False, "estimate": False}, "unknown", id="estimate=False"),
]


@pytest.mark.parametrize(("options", "counted"), LOOPS)
def test_a_looping_agent_whose_streams_report_no_usage_is_stopped(
    llm_server: LLMServer, clock: Clock, options: dict[str, bool], counted: str
) -> None:
    """The drill of issue 8: an agent streams without asking for usage and loops. Its usage is
    asked for (by default) or estimated (without injection), so it is stopped; only with
    ``estimate=False`` too does it run unseen, as every such loop did before."""
    fuse = Fuse(MemoryStore(clock=clock), velocity=POLICY)
    recorded = Recorded(fuse)
    transport = FuseTransport(fuse=fuse, **options)
    key = f"sk-loop-{uuid.uuid4().hex}"
    ask = streaming_agent(llm_server, transport, key)
    for _ in range(WARM_UP):  # its normal pace: a call a minute
        ask(TASK)
        clock.advance(60)
    stopped = counted != "unknown"
    assert fuse.status(Identity.secret(key)).established is stopped
    messages = list(TASK)
    sent = len(llm_server.bodies)
    calls = 0
    refusal: LoopSuspected | None = None
    try:
        while calls < 30:  # the agent's bug: it never stops by itself
            messages += [
                {"role": "assistant", "content": ask(messages)},
                {"role": "user", "content": "That did not work. Try again."},
            ]
            calls += 1
    except LoopSuspected as exc:
        refusal = exc
    billed = sum(llm_server.billed[sent - WARM_UP :])  # the server's own count, asked for or not
    print(  # -rP
        f"{counted}: {calls} looping calls answered before the refusal ({refusal is not None}); "
        f"billed {billed} tokens, recorded {recorded.total:.0f} ({recorded.total / billed:.2f}x)"
    )
    assert len(llm_server.bodies) - sent == calls  # nothing reached the server after the trip
    if stopped:
        assert refusal is not None
        assert refusal.key == Identity.secret(key).label
        assert calls < 15
    else:  # without estimates the loop runs unseen: the hole of issue 8
        assert refusal is None
        assert calls == 30
        assert recorded.total == 0
    asked = [b"stream_options" in body for body in llm_server.bodies[sent:]]
    assert asked == [counted == "asked"] * calls
    if counted == "asked":
        assert recorded.total == billed  # exact
    expected = {
        "asked": (0, 0),
        "estimated": (WARM_UP + calls, 0),
        "unknown": (0, WARM_UP + calls),
    }
    assert (fuse.stats.usage.estimated, fuse.stats.usage.unknown) == expected[counted]
