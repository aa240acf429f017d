"""Who is calling: untrusted headers become bounded, hashed identities."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.middleware.apps import Call
from tokenfuse import Fuse, Identity, MemoryStore
from tokenfuse._identity import MAX_IDENTITY_LENGTH
from tokenfuse._middleware import CALL_VELOCITY, by_header, inbound_fuse
from tokenfuse._middleware.identify import bearer_or_api_key
from tokenfuse._middleware.request import AsgiRequest, WsgiRequest


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
        assert expected not in found.key
        assert expected not in found.label


def test_identities_are_cut_to_a_bounded_length() -> None:
    huge = "k" * 1_000_000

    found = bearer_or_api_key(_asgi(("x-api-key", huge)))

    assert found == Identity.secret("k" * MAX_IDENTITY_LENGTH)
    assert len(found.label) < 20


def test_the_raw_credential_never_reaches_the_store(
    serve: Callable[..., Call], make_fuse: Callable[..., Fuse], store: MemoryStore
) -> None:
    secret = "sk-live-very-secret-credential-0001"
    call = serve(fuse=make_fuse())

    call("POST", "/tools/refund", {"Authorization": f"Bearer {secret}"})

    [key] = list(store._entries)
    assert secret not in key
    assert key == f"inbound:{Identity.secret(secret).key}"


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
