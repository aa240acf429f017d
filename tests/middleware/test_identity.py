"""Who is calling: untrusted headers become whole, keyed identities; unverified callers are
counted per client address, believing X-Forwarded-For only from trusted proxies."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from tests.middleware.apps import Call
from tokenfuse import ConfigurationError, Fuse, Identity, MemoryStore
from tokenfuse._middleware import CALL_VELOCITY, TokenFuse, TokenFuseWSGI, by_header, inbound_fuse
from tokenfuse._middleware.identify import bearer_or_api_key, verified
from tokenfuse._middleware.request import AsgiRequest, WsgiRequest

VALID_KEY = "sk-live-valid-customer-key-0001"


def _asgi(*headers: tuple[str, str]) -> AsgiRequest:
    return AsgiRequest({"type": "http", "headers": [(k.encode(), v.encode()) for k, v in headers]})


def _wsgi(*headers: tuple[str, str]) -> WsgiRequest:
    return WsgiRequest({"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers})


@pytest.mark.parametrize("view", [_asgi, _wsgi], ids=["asgi", "wsgi"])
@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param([("authorization", "Bearer sk-abc-123456")], "sk-abc-123456", id="bearer"),
        pytest.param([("authorization", "bearer   sk-abc-123456  ")], "sk-abc-123456", id="case"),
        pytest.param([("x-api-key", "key-98765432")], "key-98765432", id="api-key"),
        pytest.param(
            [("authorization", "Basic dXNlcjpwYXNz"), ("x-api-key", "key-98765432")],
            "key-98765432",
            id="basic-falls-back-to-api-key",
        ),
        pytest.param([("authorization", "Bearer ")], None, id="empty-bearer"),
        pytest.param([("x-api-key", "   ")], None, id="blank-key"),
        pytest.param([], None, id="none"),
    ],
)
def test_default_identity_is_the_hashed_credential(
    view: Callable[..., object], headers: list[tuple[str, str]], expected: str | None
) -> None:
    found = bearer_or_api_key(view(*headers))  # type: ignore[arg-type]

    assert found == (Identity.secret(expected) if expected is not None else None)
    if found is not None:
        assert expected is not None
        assert expected not in repr(found)
        assert expected not in found.label


def test_long_bearer_tokens_with_a_common_prefix_get_buckets_of_their_own(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    issuer = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9." + "e30" * 200  # 637 shared characters
    call = serve(fuse=make_fuse())
    first = {"Authorization": f"Bearer {issuer}.sig-a"}
    for _ in range(50):
        assert call("POST", "/tools/refund", first).status == 200

    other = call("POST", "/tools/refund", {"Authorization": f"Bearer {issuer}.sig-b"})

    assert other.status == 200
    assert other.headers["ratelimit"] == '"default";r=49;t=1'  # not the first token's bucket


def test_the_raw_credential_never_reaches_the_store(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse], store: MemoryStore
) -> None:
    secret = "sk-live-very-secret-credential-0001"
    fuse = make_fuse()
    call = serve(fuse=fuse)

    call("POST", "/tools/refund", {"Authorization": f"Bearer {secret}"})

    [key] = list(store._entries)
    assert secret not in key
    assert key == fuse._key(Identity.secret(secret))


def test_a_huge_spoofed_identity_header_does_not_break_the_request(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    call = serve(fuse=make_fuse())

    reply = call("POST", "/tools/refund", {"Authorization": "Bearer " + "x" * 200_000})

    assert reply.status == 200
    assert reply.headers["ratelimit"] == '"default";r=49;t=1'


def test_a_flood_of_invented_identities_costs_bounded_memory(
    serve: Callable[..., Call], clock: object
) -> None:
    store = MemoryStore(max_keys=10)
    call = serve(fuse=inbound_fuse(store, velocity=CALL_VELOCITY))

    for n in range(60):
        assert call("POST", "/tools/refund", {"X-API-Key": f"spoofed-{n:06d}"}).status == 200

    assert len(store) <= 10


def test_requests_without_identity_share_one_anonymous_bucket_by_default(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    call = serve(fuse=make_fuse())

    assert call("POST", "/tools/refund").headers["ratelimit"] == '"default";r=49;t=1'
    assert call("POST", "/tools/crm").headers["ratelimit"] == '"default";r=48;t=1'
    keyed = call("POST", "/tools/crm", {"X-API-Key": "key-000000001"})
    assert keyed.headers["ratelimit"] == '"default";r=49;t=1'


def test_anonymous_allow_lets_requests_without_identity_through_unguarded(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    call = serve(fuse=make_fuse(), anonymous="allow")

    for _ in range(60):
        reply = call("POST", "/tools/refund")
        assert reply.status == 200
        assert "ratelimit" not in reply.headers


def test_identify_by_an_org_header(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    fuse = make_fuse()
    call = serve(fuse=fuse, identify=by_header("X-Org-Id"))

    call("POST", "/tools/refund", {"X-Org-Id": "org-acme", "X-API-Key": "key-aaaaaaaa1"})
    shared = call("POST", "/tools/refund", {"X-Org-Id": "org-acme", "X-API-Key": "key-bbbbbb2"})

    assert shared.headers["ratelimit"] == '"default";r=48;t=1'  # one org, one bucket
    assert fuse.status("org-acme").bucket_level == 48.0


def test_a_failing_identify_function_falls_back_to_the_anonymous_identity(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse]
) -> None:
    def identify(request: object) -> str:
        raise RuntimeError("user lookup is down")

    call = serve(fuse=make_fuse(), identify=identify)

    first = call("POST", "/tools/refund", {"X-API-Key": "key-000000001"})
    second = call("POST", "/tools/refund", {"X-API-Key": "key-000000002"})

    assert (first.status, second.status) == (200, 200)
    assert second.headers["ratelimit"] == '"default";r=48;t=1'


# -- unverified callers: one bucket per client address ------------------------------------------
# The middleware is called directly as an ASGI / WSGI app, so that each request can come from
# the peer address the test chooses (a test client has one fixed address).


async def _ok_asgi(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def _ok_wsgi(environ: Any, start_response: Any) -> list[bytes]:
    start_response("200 OK", [])
    return [b"ok"]


Send = Callable[[Mapping[str, str], str | None], int]


def _asgi_sender(**options: Any) -> Send:
    import asyncio

    app = TokenFuse(_ok_asgi, **options)

    def send(headers: Mapping[str, str], peer: str | None) -> int:
        scope: dict[str, Any] = {
            "type": "http",
            "method": "POST",
            "path": "/tools/refund",
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
            "client": (peer, 50000) if peer is not None else None,
        }
        statuses: list[int] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def reply(message: Mapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses.append(message["status"])

        asyncio.run(app(scope, receive, reply))
        return statuses[0]

    return send


def _wsgi_sender(**options: Any) -> Send:
    app = TokenFuseWSGI(_ok_wsgi, **options)

    def send(headers: Mapping[str, str], peer: str | None) -> int:
        environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/tools/refund"}
        environ |= {"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()}
        if peer is not None:
            environ["REMOTE_ADDR"] = peer
        statuses: list[int] = []
        app(environ, lambda status, _headers, _exc=None: statuses.append(int(status[:3])))
        return statuses[0]

    return send


@pytest.fixture(params=["asgi", "wsgi"])
def sender(request: pytest.FixtureRequest, make_fuse: Callable[..., Fuse]) -> Callable[..., Send]:
    """``sender(**options) -> send(headers, peer) -> status``, over ASGI or WSGI."""
    build = _asgi_sender if request.param == "asgi" else _wsgi_sender

    def make(**options: Any) -> Send:
        return build(fuse=make_fuse(), **options)

    return make


def _rotating(send: Send, peer: str, calls: int) -> int:
    """Calls with a newly invented API key each; how many were let through."""
    return sum(send({"X-API-Key": f"invented-{n:06d}"}, peer) == 200 for n in range(calls))


def test_by_default_every_invented_key_gets_a_fresh_bucket(sender: Callable[..., Send]) -> None:
    send = sender()
    assert _rotating(send, "203.0.113.7", 1000) == 1000  # the hole `verified` closes


def test_verified_keys_and_client_buckets_stop_rotating_keys(sender: Callable[..., Send]) -> None:
    send = sender(identify=verified({VALID_KEY}), anonymous="client")

    assert _rotating(send, "203.0.113.7", 1000) == 50  # FREE: a burst of 50, clock stopped
    assert send({"X-API-Key": VALID_KEY}, "203.0.113.7") == 200  # a real key: its own bucket
    assert _rotating(send, "198.51.100.9", 60) == 50  # another client: its own bucket


def test_a_verifying_predicate_sees_the_raw_credential(sender: Callable[..., Send]) -> None:
    seen: list[str] = []

    def is_valid(key: str) -> bool:
        seen.append(key)
        return key.startswith("sk-live-")

    send = sender(identify=verified(is_valid), anonymous="client")

    assert send({"Authorization": f"Bearer {VALID_KEY}"}, "203.0.113.7") == 200
    assert send({"X-API-Key": "made-up"}, "203.0.113.7") == 200
    assert seen == [VALID_KEY, "made-up"]


def test_a_failing_predicate_counts_the_request_per_client_and_says_so_once(
    sender: Callable[..., Send], caplog: pytest.LogCaptureFixture
) -> None:
    def is_valid(key: str) -> bool:
        raise ConnectionError("key database down")

    send = sender(identify=verified(is_valid), anonymous="client")
    with caplog.at_level(logging.WARNING, logger="tokenfuse.middleware"):
        assert _rotating(send, "203.0.113.7", 60) == 50

    assert len([r for r in caplog.records if "verified(" in r.getMessage()]) == 1


def test_x_forwarded_for_from_an_untrusted_peer_is_ignored(sender: Callable[..., Send]) -> None:
    send = sender(identify=verified({VALID_KEY}), anonymous="client")

    admitted = sum(
        send({"X-Forwarded-For": f"192.0.2.{n % 250}"}, "203.0.113.7") == 200 for n in range(60)
    )

    assert admitted == 50  # one peer, one bucket, whatever it claims to forward


def test_x_forwarded_for_from_a_trusted_proxy_names_the_client(
    sender: Callable[..., Send],
) -> None:
    send = sender(anonymous="client", identify=verified(()), trusted_proxies=["10.0.0.0/8"])

    def through_proxy(client: str) -> int:
        return send({"X-Forwarded-For": client}, "10.0.0.5")

    assert sum(through_proxy("203.0.113.7") == 200 for _ in range(60)) == 50
    assert through_proxy("198.51.100.9") == 200  # another client behind the same proxy
    # A client writing its own X-Forwarded-For only adds entries left of the real one.
    assert through_proxy("192.0.2.1, 203.0.113.7") == 429


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        pytest.param("10.0.0.5", None, "10.0.0.5", id="trusted-peer-no-header"),
        pytest.param("10.0.0.5", "203.0.113.7", "203.0.113.7", id="one-proxy"),
        pytest.param("10.0.0.5", "6.6.6.6, 203.0.113.7, 10.0.0.9", "203.0.113.7",
                     id="two-proxies-and-a-spoofed-entry"),
        pytest.param("10.0.0.5", "10.0.0.8, 10.0.0.9", "10.0.0.8", id="all-trusted"),
        pytest.param("10.0.0.5", "garbage, 10.0.0.9", "10.0.0.9", id="garbage-stops-the-walk"),
        pytest.param("10.0.0.5", "203.0.113.7:4711", "203.0.113.7", id="with-port"),
        pytest.param("10.0.0.5", "[2001:db8::1]:4711", "2001:db8::1", id="ipv6-with-port"),
        pytest.param("203.0.113.7", "192.0.2.1", "203.0.113.7", id="untrusted-peer"),
        pytest.param("::ffff:10.0.0.5", "203.0.113.7", "203.0.113.7", id="ipv4-mapped-peer"),
        pytest.param("2001:db8:aa:bb::1", None, "2001:db8:aa:bb::9", id="ipv6-as-its-64"),
    ],
)  # fmt: skip
def test_the_client_address(peer: str, forwarded: str | None, client: str) -> None:
    from tokenfuse._middleware.clients import ClientAddress

    headers = [(b"x-forwarded-for", forwarded.encode())] if forwarded else []
    request = AsgiRequest({"client": (peer, 1), "headers": headers})

    assert ClientAddress(["10.0.0.0/8"])(request) == Identity.client(client)


def test_every_x_forwarded_for_line_is_read() -> None:
    from tokenfuse._middleware.clients import ClientAddress

    headers = [(b"x-forwarded-for", b"192.0.2.1"), (b"x-forwarded-for", b"203.0.113.7")]
    request = AsgiRequest({"client": ("10.0.0.5", 1), "headers": headers})

    assert ClientAddress(["10.0.0.0/8"])(request) == Identity.client("203.0.113.7")


#: Header pairs no ASGI server should send: not a pair, a text name, a number for a value.
MALFORMED: list[Any] = [(b"x-a", b"1", b"extra"), ("x-api-key", "text"), (b"x-b", 7), None, b"xy"]


def test_malformed_header_pairs_are_skipped_and_the_valid_ones_still_read() -> None:
    headers = [*MALFORMED, (b"x-org-id", b"acme"), (b"x-list", b"a"), (b"x-list", bytearray(b"b"))]
    request = AsgiRequest({"type": "http", "headers": headers})

    assert request.header("X-Org-Id") == "acme"  # asked in any case
    assert request.header("X-LIST") == "a"
    assert request.header_list("x-list") == "a, b"
    assert request.header("x-api-key") is None
    assert request.header("x-b") is None
    assert request.header_list("x-a") is None


@pytest.mark.parametrize("headers", [None, 5], ids=["none", "not-iterable"])
def test_a_scope_without_a_header_list_has_no_headers(headers: object) -> None:
    request = AsgiRequest({"type": "http", "headers": headers})

    assert request.header("authorization") is None
    assert request.header_list("x-forwarded-for") is None


def test_without_a_peer_address_unverified_callers_share_the_anonymous_bucket(
    sender: Callable[..., Send],
) -> None:
    send = sender(identify=verified({VALID_KEY}), anonymous="client")
    assert _rotating(send, None, 60) == 50  # a Unix socket: one bucket for all of them


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({"trusted_proxies": ["10.0.0.0/33"]}, "not an IP", id="bad-cidr"),
        pytest.param({"trusted_proxies": "10.0.0.0/8"}, "list of networks", id="one-string"),
        pytest.param({"anonymous": "nobody"}, "anonymous must be", id="anonymous"),
    ],
)
def test_bad_identity_options_are_refused_at_construction(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        TokenFuse(_ok_asgi, **options)


def test_verified_takes_a_predicate_or_a_collection_of_keys() -> None:
    with pytest.raises(ConfigurationError, match="predicate or a collection"):
        verified(VALID_KEY)
    assert verified([VALID_KEY])(_asgi(("x-api-key", VALID_KEY))) == Identity.secret(VALID_KEY)
    assert verified([VALID_KEY])(_asgi(("x-api-key", "other"))) is None
