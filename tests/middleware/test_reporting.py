"""``count="tokens"``: a tool endpoint guarded by what its handler reports it spent."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.middleware.apps import STREAM_CHUNKS, Call
from tokenfuse import Fuse, Identity, VelocityPolicy

TOKEN = "sk-test-tokens-0001"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WHO = Identity.secret(TOKEN)


@pytest.fixture
def token_fuse(make_fuse: Callable[..., Fuse]) -> Fuse:
    return make_fuse(velocity=VelocityPolicy(unit="tokens", limit=1_000, cold_start_limit=None))


def test_the_tokens_header_is_recorded_and_stripped(
    serve: Callable[..., Call], token_fuse: Fuse
) -> None:
    call = serve(fuse=token_fuse, count="tokens")

    reply = call("POST", "/tools/summarize", {**AUTH, "x-spend": "600"})

    assert reply.status == 200
    assert "tokenfuse-tokens" not in reply.headers
    assert token_fuse.status(WHO).rate == 600.0


def test_reported_tokens_trip_the_next_call(serve: Callable[..., Call], token_fuse: Fuse) -> None:
    call = serve(fuse=token_fuse, count="tokens")
    assert call("POST", "/tools/summarize", {**AUTH, "x-spend": "600"}).status == 200

    # This call is already paid for: it is answered, and its 1,200 tokens/min open the key.
    assert call("POST", "/tools/summarize", {**AUTH, "x-spend": "600"}).status == 200
    refused = call("POST", "/tools/crm", AUTH)

    assert refused.status == 429
    body = refused.json()
    assert body["type"] == "manual_ceiling"
    assert body["unit"] == "tokens"
    assert (body["rate"], body["limit"]) == (1200.0, 1000.0)
    key_id = token_fuse.key_id(WHO)
    assert body["key_id"] == key_id
    assert body["message"] == (
        "rate over the ceiling: 1,200 tokens/min is above 1,000 tokens/min for key "
        f"sk-…0001 [id {key_id}] (blocked for 60 s)"
    )


def test_report_tokens_inside_the_handler(serve: Callable[..., Call], token_fuse: Fuse) -> None:
    call = serve(fuse=token_fuse, count="tokens")

    reply = call("POST", "/tools/report", {**AUTH, "x-spend": "250"})

    assert reply.json() == {"reported": True}
    assert token_fuse.status(WHO).rate == 250.0


def test_report_tokens_from_inside_a_streamed_body(
    serve: Callable[..., Call], token_fuse: Fuse
) -> None:
    call = serve(fuse=token_fuse, count="tokens")

    reply = call("GET", "/stream-report", {**AUTH, "x-spend": "7"})

    assert reply.body == b"".join(STREAM_CHUNKS)
    assert token_fuse.status(WHO).rate == 7.0 * len(STREAM_CHUNKS)


@pytest.mark.parametrize(
    "spend",
    [
        pytest.param("abc", id="not-a-number"),
        pytest.param("nan", id="nan"),
        pytest.param("-500", id="negative"),
        pytest.param("1e999", id="infinite"),
        pytest.param("", id="empty"),
        pytest.param("9" * 5000, id="huge-text"),
    ],
)
def test_malformed_reports_record_nothing_and_break_nothing(
    serve: Callable[..., Call], token_fuse: Fuse, spend: str
) -> None:
    call = serve(fuse=token_fuse, count="tokens")

    header = call("POST", "/tools/summarize", {**AUTH, "x-spend": spend})

    assert header.status == 200
    assert "tokenfuse-tokens" not in header.headers
    assert token_fuse.status(WHO).rate == 0.0


def test_counting_calls_ignores_reports_but_still_strips_the_header(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    fuse = make_fuse()
    call = serve(fuse=fuse)

    summarize = call("POST", "/tools/summarize", {**AUTH, "x-spend": "600"})
    report = call("POST", "/tools/report", {**AUTH, "x-spend": "600"})

    assert "tokenfuse-tokens" not in summarize.headers
    assert report.json() == {"reported": False}
    assert fuse.status(WHO).rate == 2.0  # two calls, counted as calls
