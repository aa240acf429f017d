"""The live stream (Server-Sent Events) of a real admin server, fed by another process.

A uvicorn process serves the admin app of a fuse on Redis; this test process trips a key on the
same Redis. The stream must push the trip as an event and the key as open in the next table.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import pytest
import redis

from tests.admin import admin_server
from tests.middleware.servers import free_port, running
from tests.stores.conftest import delete_prefix
from tokenfuse._identity import Identity

pytestmark = [pytest.mark.redis, pytest.mark.slow]

TOKEN = "stream-admin-token-0123456789"


class Server:
    def __init__(self, url: str, env: dict[str, str]) -> None:
        self.url = url
        self.env = env


@pytest.fixture
def server(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    prefix = f"tf-sse-{uuid.uuid4().hex[:8]}"
    env = {"ADMIN_REDIS_URL": redis_url, "ADMIN_PREFIX": prefix, "ADMIN_TOKEN": TOKEN}
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # for admin_server.fuse() in this process too
    port = free_port()
    args = ["-m", "uvicorn", "tests.admin.admin_server:app", "--port", str(port)]
    try:
        with running([*args, "--log-level", "warning"], port, env=env):
            yield Server(f"http://127.0.0.1:{port}", env)
    finally:
        with redis.Redis.from_url(redis_url) as raw:
            delete_prefix(raw, prefix)


def events(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, object]]]:
    """(event name, data) of each Server-Sent Event in ``lines``."""
    name, data = "message", ""
    for line in lines:
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data += line[5:].strip()
        elif not line and data:
            yield name, json.loads(data)
            name, data = "message", ""


def test_the_stream_pushes_a_trip_from_another_process(server: Server) -> None:
    fuse = admin_server.fuse()
    fuse.admit("agent-steady", amount=100)
    looping = Identity.named("agent-loop").key_id
    headers = {"Authorization": f"Bearer {TOKEN}"}
    seen: list[str] = []
    with (
        httpx.Client(base_url=server.url, timeout=10) as client,
        client.stream("GET", "/api/stream", headers=headers) as stream,
    ):
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        for name, data in events(stream.iter_lines()):
            seen.append(name)
            if name == "keys" and "tripped" not in seen:
                keys = data["keys"]
                assert isinstance(keys, list)
                assert all(key["key_id"] != looping or key["state"] != "open" for key in keys)
                # Trip it now, in this process: a decision the server knows nothing of.
                fuse.admit("agent-loop", amount=150_000)  # over the cold-start ceiling
                seen.append("tripped")
            elif name == "fuse" and data["kind"] == "tripped":
                assert (data["key_id"], data["label"]) == (looping, "agent-loop")
            elif name == "keys" and "fuse" in seen:
                keys = data["keys"]
                assert isinstance(keys, list)
                assert (keys[0]["key_id"], keys[0]["state"]) == (looping, "open")  # open first
                break
            assert len(seen) < 50, seen
    assert seen.count("keys") >= 2
    store = fuse.store
    store.close()  # type: ignore[attr-defined]


def test_the_stream_needs_the_token(server: Server) -> None:
    answer = httpx.get(f"{server.url}/api/stream", timeout=10)
    assert answer.status_code == 401
    page = httpx.get(f"{server.url}/", timeout=10)
    assert page.status_code == 200 and "tokenfuse" in page.text
