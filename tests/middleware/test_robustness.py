"""Bad input and bad days: malformed costs, a dead store, broken option callables."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn

import pytest

from tests.middleware.apps import Call
from tokenfuse import FREE, Fuse, StoreUnavailable
from tokenfuse._middleware import CALL_VELOCITY, inbound_fuse
from tokenfuse._middleware.request import RequestView

AUTH = {"Authorization": "Bearer sk-test-robust-0001"}


class DeadStore:
    """A store whose backend is gone: every call fails the way a store reports it."""

    def __init__(self) -> None:
        self.calls = 0

    def run(self, op: Any) -> NoReturn:
        self.calls += 1
        raise StoreUnavailable("connection refused")

    async def arun(self, op: Any) -> NoReturn:
        self.run(op)


def header_cost(request: RequestView) -> float:
    return float(request.header("x-cost") or 1)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("abc", id="not-a-number"),
        pytest.param("nan", id="nan"),
        pytest.param("-3", id="negative"),
        pytest.param("1e999", id="infinite"),
        pytest.param("", id="empty"),
        pytest.param("5" * 10_000, id="huge"),
    ],
)
def test_malformed_cost_headers_cost_one_call_and_break_nothing(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse], value: str
) -> None:
    call = serve(fuse=make_fuse(), cost=header_cost)

    reply = call("POST", "/tools/refund", {**AUTH, "x-cost": value})

    assert reply.status == 200
    assert reply.headers["ratelimit"] == '"default";r=49;t=1'


@pytest.mark.parametrize("value", ["nan", "-3", "1e999", "-inf"])
def test_a_bad_per_request_cost_is_logged_once_not_silently_charged_as_one(
    serve: Callable[..., Call],
    make_fuse: Callable[..., Fuse],
    caplog: pytest.LogCaptureFixture,
    value: str,
) -> None:
    call = serve(fuse=make_fuse(), cost=header_cost)

    with caplog.at_level(logging.WARNING, logger="tokenfuse.middleware"):
        for bad in (value, "nan", "-1", "-2", "inf"):  # a caller varying the bad value
            assert call("POST", "/tools/refund", {**AUTH, "x-cost": bad}).status == 200

    [line] = [r.getMessage() for r in caplog.records if "cost function" in r.getMessage()]
    assert f"returned {float(value)!r}, not a finite, non-negative number" in line
    assert "header_cost" in line


def test_a_tiers_function_returning_no_policy_is_logged_once(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse], caplog: pytest.LogCaptureFixture
) -> None:
    call = serve(fuse=make_fuse(), tiers=lambda request, identity: {"rate": 5})

    with caplog.at_level(logging.WARNING, logger="tokenfuse.middleware"):
        replies = [call("POST", "/tools/refund", AUTH) for _ in range(3)]

    assert [reply.headers["ratelimit"] for reply in replies][-1] == '"default";r=47;t=1'
    [line] = [r.getMessage() for r in caplog.records if "tiers function" in r.getMessage()]
    assert "not a BucketPolicy or None" in line


def test_an_absurd_cost_is_refused_with_sane_headers(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    call = serve(fuse=make_fuse(), cost=header_cost)

    reply = call("POST", "/tools/refund", {**AUTH, "x-cost": "1e300"})

    assert reply.status == 429
    assert reply.headers["retry-after"] == "1000000000"  # capped, not 300 digits
    assert reply.headers["ratelimit"] == '"default";r=50;t=1000000000'
    assert reply.json()["retry_after"] == pytest.approx(1e299)


def test_a_valid_cost_header_is_charged(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    call = serve(fuse=make_fuse(), cost=header_cost)

    assert call("POST", "/tools/refund", {**AUTH, "x-cost": "5"}).headers["ratelimit"] == (
        '"default";r=45;t=1'
    )


def test_a_dead_store_fails_open_without_headers(serve: Callable[..., Call]) -> None:
    store = DeadStore()
    call = serve(fuse=inbound_fuse(store, velocity=CALL_VELOCITY))

    replies = [call("POST", "/tools/refund", AUTH) for _ in range(60)]

    assert {reply.status for reply in replies} == {200}
    assert all("ratelimit" not in reply.headers for reply in replies)
    assert 0 < store.calls < 60  # after repeated failures the store is skipped for a while


def test_a_dead_store_while_counting_tokens_still_answers(serve: Callable[..., Call]) -> None:
    call = serve(fuse=inbound_fuse(DeadStore(), velocity=CALL_VELOCITY), count="tokens")

    reply = call("POST", "/tools/summarize", {**AUTH, "x-spend": "100"})

    assert reply.status == 200


def test_fail_closed_answers_503_not_500(serve: Callable[..., Call]) -> None:
    call = serve(fuse=inbound_fuse(DeadStore(), fail_closed=True))

    reply = call("POST", "/tools/refund", AUTH)

    assert reply.status == 503
    assert reply.headers["retry-after"] == "1"
    body = reply.json()
    assert body["type"] == "store_unavailable"
    assert body["retry_after"] == 1


def test_broken_option_callables_never_turn_into_500s(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    def broken(*args: object) -> Any:
        raise KeyError("boom")

    call = serve(fuse=make_fuse(), cost=broken, exclude=broken, tiers=broken)

    reply = call("POST", "/tools/refund", AUTH)

    assert reply.status == 200
    assert reply.headers["ratelimit"] == '"default";r=49;t=1'  # guarded, cost 1, default tier


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({"count": "dollars"}, "count must be", id="count"),
        pytest.param({"anonymous": "deny"}, "anonymous must be", id="anonymous"),
        pytest.param({"cost": -1}, "cost must be", id="negative-cost"),
        pytest.param({"cost": float("inf")}, "cost must be", id="infinite-cost"),
        pytest.param({"cost": {"/a": -2}}, "cost must be", id="negative-route-cost"),
        pytest.param({"cost": {"/a": float("nan")}}, "cost must be", id="nan-route-cost"),
        pytest.param({"exclude": "/health"}, "list of paths", id="exclude-string"),
        pytest.param({"policy_name": 'x"y'}, "policy_name", id="policy-name"),
        pytest.param({"tiers": {"org": 5}}, "BucketPolicy", id="tier-type"),
        pytest.param(
            {"count": "tokens", "fuse": inbound_fuse(velocity=None, bucket=FREE)},
            "velocity",
            id="tokens-without-velocity",
        ),
    ],
)
def test_bad_options_fail_at_construction(options: dict[str, Any], message: str) -> None:
    from tokenfuse import ConfigurationError
    from tokenfuse._middleware import TokenFuse, TokenFuseWSGI

    async def asgi(scope: Any, receive: Any, send: Any) -> None: ...

    def wsgi(environ: Any, start_response: Any) -> list[bytes]:
        return []

    with pytest.raises(ConfigurationError, match=message):
        TokenFuse(asgi, **options)
    with pytest.raises(ConfigurationError, match=message):
        TokenFuseWSGI(wsgi, **options)
