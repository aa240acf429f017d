"""Who a call is counted for: credentials (hashed, shown redacted), scopes, keys, callables."""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any

import pytest

from tokenfuse import Fuse, Identity
from tokenfuse._transport import AsyncFuseTransport, FuseTransport, current_scope, scope

from .bodies import CASES
from .conftest import ChunkServer

CHAT = CASES["openai-chat"]
URL = CHAT.url


def report_of(
    lib: ModuleType, fuse: Fuse, *, headers: Any = None, url: str = URL, **kw: Any
) -> Any:
    transport = FuseTransport(ChunkServer(lib, CHAT).transport(), fuse=fuse, **kw)
    with lib.Client(transport=transport) as client:
        return client.post(url, headers=headers, content=b"{}").extensions["tokenfuse"]


@pytest.mark.parametrize(
    ("headers", "url", "secret", "label"),
    [
        pytest.param(
            {"Authorization": "Bearer sk-proj-0123456789abcdef"}, URL,
            "sk-proj-0123456789abcdef", "sk-…cdef", id="bearer",
        ),
        pytest.param(
            {"authorization": "bearer   sk-proj-0123456789abcdef  "}, URL,
            "sk-proj-0123456789abcdef", "sk-…cdef", id="bearer-lowercase-padded",
        ),
        pytest.param(
            {"x-api-key": "sk-ant-api03-zyxw9876"}, URL,
            "sk-ant-api03-zyxw9876", "sk-…9876", id="x-api-key",
        ),
        pytest.param(
            {"api-key": "0123456789abcdef0123456789abcdef"}, URL,
            "0123456789abcdef0123456789abcdef", "012…cdef", id="azure-api-key",
        ),
        pytest.param(
            {"x-goog-api-key": "AIzaSyA-1234567890"}, URL,
            "AIzaSyA-1234567890", "AIz…", id="x-goog-api-key",  # too short to show a tail
        ),
        pytest.param(
            None, URL + "?alt=sse&key=AIzaSyB-0987654321",
            "AIzaSyB-0987654321", "AIz…", id="query-key",
        ),
        pytest.param(
            {
                "Authorization": "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20260101/"
                "us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature=f00d"
            },
            URL, "AKIAIOSFODNN7EXAMPLE", "AKI…MPLE", id="sigv4-access-key-id",
        ),
    ],
)  # fmt: skip
def test_the_credential_is_the_identity_hashed_and_redacted(
    lib: ModuleType, fuse: Fuse, headers: Any, url: str, secret: str, label: str
) -> None:
    report = report_of(lib, fuse, headers=headers, url=url)
    assert report.identity == Identity.secret(secret)
    assert report.key == label
    assert secret not in repr(report)
    assert fuse.status(Identity.secret(secret)).rate == 25


def test_sigv4_signatures_change_but_the_key_stays(lib: ModuleType, fuse: Fuse) -> None:
    signed = "AWS4-HMAC-SHA256 Credential=AKIAEXAMPLE/20260101/us-east-1/bedrock/aws4_request, "
    first = report_of(lib, fuse, headers={"Authorization": signed + "Signature=aaaa"})
    second = report_of(lib, fuse, headers={"Authorization": signed + "Signature=bbbb"})
    assert first.identity == second.identity


def test_different_keys_are_counted_apart(lib: ModuleType, fuse: Fuse) -> None:
    one = report_of(lib, fuse, headers={"x-api-key": "sk-ant-one-1111"})
    two = report_of(lib, fuse, headers={"x-api-key": "sk-ant-two-2222"})
    assert one.identity != two.identity
    assert (one.record.rate, two.record.rate) == (25, 25)


def test_no_credential_counts_for_the_host(lib: ModuleType, fuse: Fuse) -> None:
    report = report_of(lib, fuse, url="http://localhost:11434/v1/chat/completions")
    assert report.identity == Identity.named("host:localhost")


def test_a_fixed_key_wins_over_the_credential(lib: ModuleType, fuse: Fuse) -> None:
    report = report_of(lib, fuse, headers=CHAT.request_headers, key="billing-team")
    assert report.identity == Identity.named("billing-team")


def test_a_callable_key_sees_the_request_and_may_fall_back(lib: ModuleType, fuse: Fuse) -> None:
    def by_header(request: Any) -> str | None:
        return request.headers.get("x-agent")

    named = report_of(lib, fuse, headers={"x-agent": "planner", "x-api-key": "k-1234567890"},
                      key=by_header)  # fmt: skip
    assert named.key == "planner"
    fallback = report_of(lib, fuse, headers={"x-api-key": "k-1234567890"}, key=by_header)
    assert fallback.identity == Identity.secret("k-1234567890")


def test_scopes_win_nest_and_unwind(lib: ModuleType, fuse: Fuse) -> None:
    assert current_scope() is None
    with scope("agent-42") as outer:
        assert report_of(lib, fuse, headers=CHAT.request_headers, key="fixed").key == "agent-42"
        with scope("agent-43"):
            assert report_of(lib, fuse).key == "agent-43"
        assert current_scope() is outer
    assert current_scope() is None
    assert report_of(lib, fuse, key="fixed").key == "fixed"


def test_a_request_extension_names_one_call(lib: ModuleType, fuse: Fuse) -> None:
    transport = FuseTransport(ChunkServer(lib, CHAT).transport(), fuse=fuse)
    with lib.Client(transport=transport) as client, scope("agent-42"):
        response = client.post(URL, extensions={"tokenfuse": {"key": "one-off"}})
    assert response.extensions["tokenfuse"].key == "one-off"


async def test_concurrent_agents_in_one_process_have_their_own_fuses(
    lib: ModuleType, fuse: Fuse
) -> None:
    transport = AsyncFuseTransport(ChunkServer(lib, CHAT).transport(), fuse=fuse)

    async def agent(name: str, calls: int) -> None:
        with scope(name):
            for _ in range(calls):
                await client.post(URL, headers=CHAT.request_headers)
                await asyncio.sleep(0)  # let the other agents interleave

    async with lib.AsyncClient(transport=transport) as client:
        await asyncio.gather(agent("a", 1), agent("b", 2), agent("c", 3))
    assert [fuse.status(name).rate for name in "abc"] == [25, 50, 75]
    assert fuse.status(Identity.secret("sk-proj-transport-test-a1b2")).rate == 0
