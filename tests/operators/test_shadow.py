"""Outbound shadow mode: the transport decides and reports, and never refuses."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from tests.conftest import Clock
from tokenfuse import (
    AsyncFuseTransport,
    CeilingExceeded,
    Fuse,
    FuseTransport,
    FuseTripped,
    MemoryStore,
    VelocityPolicy,
)
from tokenfuse.config import Settings

URL = "https://api.openai.com/v1/chat/completions"


def llm(request: httpx.Request) -> httpx.Response:
    usage = {"prompt_tokens": 1_500, "completion_tokens": 500}
    return httpx.Response(200, json={"usage": usage})


def ceiling(clock: Clock) -> Fuse:
    return Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(limit=3_000))


def post(client: httpx.Client) -> httpx.Response:
    return client.post(URL, content=json.dumps({"model": "m", "messages": []}))


def test_a_refused_call_is_sent_reported_and_logged(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    sent: list[httpx.Request] = []

    def counting(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return llm(request)

    transport = FuseTransport(httpx.MockTransport(counting), fuse=ceiling(clock), shadow=True)
    client = httpx.Client(transport=transport, headers={"authorization": "Bearer sk-s-0123456789"})
    reports = [post(client).extensions["tokenfuse"] for _ in range(4)]
    assert len(sent) == 4  # nothing refused
    assert reports[1].tripped
    assert [report.gate.allowed for report in reports] == [True, True, False, False]
    assert isinstance(reports[2].gate.error, CeilingExceeded)
    shadow_lines = [r.message for r in caplog.records if "shadow mode, would refuse" in r.message]
    assert len(shadow_lines) == 1  # the second one was held back by the throttle
    assert "POST https://api.openai.com/v1/chat/completions: manual_ceiling" in shadow_lines[0]


def test_without_shadow_the_same_call_is_refused(clock: Clock) -> None:
    transport = FuseTransport(httpx.MockTransport(llm), fuse=ceiling(clock))
    client = httpx.Client(transport=transport)
    post(client)
    post(client)
    with pytest.raises(CeilingExceeded):
        post(client)


async def test_the_async_transport_has_shadow_mode_too(clock: Clock) -> None:
    transport = AsyncFuseTransport(httpx.MockTransport(llm), fuse=ceiling(clock), shadow=True)
    async with httpx.AsyncClient(transport=transport) as client:
        for _ in range(4):
            response = await client.post(URL, content=b"{}")
            assert response.status_code == 200
    assert not response.extensions["tokenfuse"].gate.allowed


def test_tokenfuse_shadow_makes_every_new_transport_a_dry_run(
    clock: Clock, environment: Callable[[dict[str, str]], Settings]
) -> None:
    environment({"TOKENFUSE_SHADOW": "1"})
    dry = FuseTransport(httpx.MockTransport(llm), fuse=ceiling(clock))
    enforcing = FuseTransport(httpx.MockTransport(llm), fuse=ceiling(clock), shadow=False)
    client = httpx.Client(transport=dry)
    assert [post(client).status_code for _ in range(4)] == [200] * 4
    enforcing_client = httpx.Client(transport=enforcing)  # shadow=False wins over the setting
    post(enforcing_client)
    post(enforcing_client)
    with pytest.raises(FuseTripped):
        post(enforcing_client)
