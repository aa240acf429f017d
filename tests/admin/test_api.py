"""The admin app's JSON API against a real Redis: what it lists, shows and changes, and who
may ask (a bearer token, same-origin requests, loopback without a token)."""

from __future__ import annotations

import json

import httpx
import pytest

import tokenfuse.admin
from tests.admin.conftest import TOKEN, asgi_client, settled
from tokenfuse import Fuse
from tokenfuse._dashboard.auth import Gatekeeper
from tokenfuse._errors import ConfigurationError
from tokenfuse._identity import Identity
from tokenfuse._stores.open_keys import OpenKeys
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_codec import key_of

pytestmark = pytest.mark.redis

WAIT = 5.0  # seconds an announcement may take to arrive on a busy machine


@pytest.fixture
def loop() -> str:
    """The key id of ``agent-loop`` under the tests' deployment secret."""
    return Identity.named("agent-loop").key_id


def view_knows_open(fuse: Fuse, who: str) -> bool:
    """Whether ``fuse``'s open-key view holds ``who``'s key (within ``WAIT`` seconds): the
    key the test watches is the one the view keeps."""
    view, key = view_and_key(fuse, who)
    return view.wait_until(lambda v: key in v._open, WAIT)


def view_refuses_nothing(fuse: Fuse, who: str) -> bool:
    """Whether ``fuse``'s open-key view has stopped refusing ``who`` by itself (within
    ``WAIT`` seconds). A reset reaches other processes by an announcement, not at once; a
    key the process tripped itself stays marked (no refusal: its gates ask the store) until
    the store's gate allows it, so an announcement does not clear that mark."""
    view, key = view_and_key(fuse, who)
    return view.wait_until(lambda v: v._open.get(key, (0.0, None))[1] is None, WAIT)


def view_and_key(fuse: Fuse, who: str) -> tuple[OpenKeys, str]:
    store = fuse.store
    assert isinstance(store, RedisStore) and store.open_keys is not None
    return store.open_keys, key_of(store.prefix, fuse._key(Identity.of(who)))


async def trip(fuse: Fuse) -> None:
    await fuse.arecord("agent-quiet", 100)
    await fuse.arecord("agent-loop", 1_500)
    await settled(fuse)


async def test_the_key_table(api: httpx.AsyncClient, other_process: Fuse, loop: str) -> None:
    await trip(other_process)
    answer = await api.get("/api/keys")
    assert answer.status_code == 200
    assert answer.headers["cache-control"] == "no-store"
    keys = answer.json()["keys"]
    assert [(k["key_id"], k["state"], k["label"]) for k in keys] == [
        (loop, "open", "agent-loop"),
        (Identity.named("agent-quiet").key_id, "ok", None),
    ]
    assert keys[0]["rate"] == 1_500 and keys[0]["limit"] == 1_000
    only_open = (await api.get("/api/keys", params={"state": "open"})).json()
    assert [k["key_id"] for k in only_open["keys"]] == [loop]
    bad = await api.get("/api/keys", params={"sort": "cost"})
    assert (bad.status_code, bad.json()["type"]) == (400, "ConfigurationError")


async def test_a_key_reset_from_the_api_is_closed_for_every_process(
    api: httpx.AsyncClient, other_process: Fuse, loop: str
) -> None:
    await trip(other_process)
    assert not other_process.gate("agent-loop").allowed
    assert view_knows_open(other_process, "agent-loop")

    answer = await api.post(f"/api/keys/{loop}/reset")

    assert answer.json() == {"ok": True, "key_id": loop, "done": "reset"}
    assert view_refuses_nothing(other_process, "agent-loop")
    assert other_process.gate("agent-loop").allowed
    detail = (await api.get(f"/api/keys/{loop}")).json()
    assert detail["key"]["state"] != "open"
    assert [event["kind"] for event in detail["events"]] == ["tripped", "reset"]
    assert len(detail["window"]) == 13


async def test_limits_and_buckets_take_rates_as_people_write_them(
    api: httpx.AsyncClient, other_process: Fuse, loop: str
) -> None:
    await trip(other_process)
    assert (await api.put(f"/api/keys/{loop}/limit", json={"limit": "50k/min"})).status_code == 200
    assert other_process.status("agent-loop").limit == 50_000
    answer = await api.put(f"/api/keys/{loop}/bucket", json={"rate": "600/min", "capacity": 20})
    assert answer.status_code == 200
    status = other_process.status("agent-loop")
    assert (status.bucket_rate, status.bucket_capacity) == (10.0, 20.0)
    await api.put(f"/api/keys/{loop}/bucket", json={"capacity": None})  # the rate stays
    status = other_process.status("agent-loop")
    assert (status.bucket_rate, status.bucket_capacity) == (10.0, 50.0)
    await api.put(f"/api/keys/{loop}/limit", json={"limit": None})
    assert other_process.status("agent-loop").limit == 1_000  # the policy's again

    bad = await api.put(f"/api/keys/{loop}/limit", json={"limit": "fast"})
    assert bad.status_code == 400 and "50k/min" in bad.json()["error"]
    assert (await api.put(f"/api/keys/{loop}/limit", json={})).status_code == 400
    assert (await api.put(f"/api/keys/{loop}/limit", content=b"[1,")).status_code == 400


async def test_unknown_and_ambiguous_keys_and_forgive(
    api: httpx.AsyncClient, other_process: Fuse, loop: str
) -> None:
    await trip(other_process)
    missing = await api.get("/api/keys/abcdef0123")
    assert (missing.status_code, missing.json()["type"]) == (404, "KeyNotFound")
    credential = await api.post("/api/keys/sk-proj-0123456789abcdef0123/reset")
    assert (credential.status_code, credential.json()["type"]) == (409, "AmbiguousKey")
    assert "0123456789abcdef" not in credential.text
    assert (await api.get("/api/keys/agent-nobody")).status_code == 404
    assert (await api.get(f"/api/keys/{loop}", params={"by": "name"})).status_code == 404
    assert (await api.get("/api/keys/agent-loop", params={"by": "name"})).status_code == 200
    forgive = await api.post(f"/api/keys/{loop}/forgive")
    if hasattr(Fuse, "forgive"):
        assert forgive.status_code == 200
    else:
        assert forgive.status_code == 501 and "reset" in forgive.json()["error"]


async def test_a_credential_is_looked_up_in_the_body_and_never_echoed(
    api: httpx.AsyncClient, other_process: Fuse
) -> None:
    secret = "sk-proj-000000000000000000009c21"
    await other_process.arecord(Identity.secret(secret), 2_000)
    await settled(other_process)
    answer = await api.post("/api/lookup", json={"secret": secret})
    assert answer.json() == {
        "key_id": Identity.secret(secret).key_id,
        "label": "sk-…9c21",
        "exists": True,
    }
    assert "0000000000000" not in answer.text
    listed = (await api.get("/api/keys")).text + (await api.get("/api/events")).text
    assert "0000000000000" not in listed
    unknown = await api.post("/api/lookup", json={"name": "agent-none"})
    assert unknown.json() == {
        "key_id": Identity.named("agent-none").key_id,
        "label": None,
        "exists": False,
    }
    assert (await api.post("/api/lookup", json={})).status_code == 400


async def test_events_of_every_process(api: httpx.AsyncClient, other_process: Fuse) -> None:
    await trip(other_process)
    await other_process.aset_limit("agent-quiet", "2k/min")
    await settled(other_process)
    events = (await api.get("/api/events", params={"count": 10})).json()["events"]
    assert [(e["kind"], e["label"]) for e in events] == [
        ("tripped", "agent-loop"),
        ("configured", "agent-quiet"),
    ]
    assert events[0]["reason"] == "manual_ceiling" and events[0]["rate"] == 1_500


async def test_the_page_is_served_without_data_and_locked_down(api: httpx.AsyncClient) -> None:
    async with asgi_client(tokenfuse.admin.app(Fuse(), token=TOKEN)) as anonymous:
        page = await anonymous.get("/")
        script = await anonymous.get("/static/dashboard.js")
        missing = await anonymous.get("/static/secrets.txt")
    assert page.status_code == 200 and '<table id="keys">' in page.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert page.headers["x-frame-options"] == "DENY"
    assert script.status_code == 200 and "textContent" in script.text
    assert "innerHTML" not in script.text  # labels are untrusted: never parsed as HTML
    assert missing.status_code == 404


# -- who may ask ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": f"Basic {TOKEN}"}],
)
async def test_a_missing_or_wrong_token_is_refused(
    redis_fuse: Fuse, headers: dict[str, str], loop: str
) -> None:
    async with asgi_client(tokenfuse.admin.app(redis_fuse, token=TOKEN), headers=headers) as client:
        for path in ("/api/keys", "/api/events", "/api/stream", "/metrics", "/api/nothing"):
            answer = await client.get(path)
            assert answer.status_code == 401, path
            assert answer.headers["www-authenticate"] == "Bearer"
        assert (await client.post(f"/api/keys/{loop}/reset")).status_code == 401


async def test_cross_origin_requests_are_refused(
    redis_fuse: Fuse, other_process: Fuse, loop: str
) -> None:
    await trip(other_process)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    app = tokenfuse.admin.app(redis_fuse, token=TOKEN)
    async with asgi_client(app, headers=auth) as client:
        evil = await client.post(
            f"/api/keys/{loop}/reset", headers={"Origin": "https://evil.example"}
        )
        assert evil.status_code == 403
        assert not other_process.gate("agent-loop").allowed  # nothing was done
        sibling = await client.post(
            f"/api/keys/{loop}/reset", headers={"Sec-Fetch-Site": "same-site"}
        )
        assert sibling.status_code == 403
        own = await client.post(
            f"/api/keys/{loop}/reset", headers={"Origin": "http://127.0.0.1:8787"}
        )
        assert own.status_code == 200
    allowed = tokenfuse.admin.app(redis_fuse, token=TOKEN, allowed_origins=["https://ops.example"])
    async with asgi_client(allowed, headers={**auth, "Origin": "https://ops.example"}) as client:
        assert (await client.get("/api/keys")).status_code == 200


async def test_without_a_token_only_loopback_is_served(redis_fuse: Fuse) -> None:
    with pytest.raises(ConfigurationError, match="needs token"):
        tokenfuse.admin.app(redis_fuse)
    with pytest.raises(ConfigurationError, match="at least 16"):
        tokenfuse.admin.app(redis_fuse, token="short")
    open_app = tokenfuse.admin.app(redis_fuse, allow_no_token_on_loopback=True)
    async with asgi_client(open_app) as local:
        assert (await local.get("/api/keys")).status_code == 200
    async with asgi_client(open_app, client=("10.1.2.3", 4000)) as remote:
        answer = await remote.get("/api/keys")
        assert answer.status_code == 403 and "loopback" in answer.json()["error"]
    async with asgi_client(open_app, base_url="http://10.0.0.5:8787") as on_a_public_address:
        assert (await on_a_public_address.get("/api/keys")).status_code == 403
    with pytest.raises(ConfigurationError, match="without a token"):
        tokenfuse.admin.serve(redis_fuse, host="0.0.0.0", allow_no_token_on_loopback=True)


def test_tokens_are_compared_whole() -> None:
    keeper = Gatekeeper(TOKEN, allow_no_token_on_loopback=False)

    def status(authorization: str) -> int | None:
        headers = {"authorization": authorization}
        refusal = keeper.refusal(headers=headers, client="1.2.3.4", server="1.2.3.4", scheme="http")
        return None if refusal is None else refusal[0]

    assert status(f"Bearer {TOKEN}") is None
    assert status(f"bearer {TOKEN}") is None
    assert status(f"Bearer {TOKEN[:-1]}") == 401
    assert status(f"Bearer {TOKEN}x") == 401
    assert status("Bearer ") == 401


async def test_metrics_are_served_behind_the_token(api: httpx.AsyncClient) -> None:
    pytest.importorskip("prometheus_client")
    answer = await api.get("/metrics")
    assert answer.status_code == 200
    assert "# HELP" in answer.text or "# TYPE" in answer.text


async def test_json_numbers_are_finite(
    api: httpx.AsyncClient, other_process: Fuse, loop: str
) -> None:
    await trip(other_process)
    text = (await api.get(f"/api/keys/{loop}")).text
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text)
