"""The live stream (Server-Sent Events) of a real admin server, fed by another process.

A uvicorn process serves the admin app of a fuse on Redis; this test process trips a key on the
same Redis. The stream must push the trip as an event and the key as open in the next table.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.admin import admin_server as server_module
from tests.admin.conftest import SERVER_TOKEN
from tokenfuse._identity import Identity

pytestmark = [pytest.mark.redis, pytest.mark.slow]


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


def test_the_stream_pushes_a_trip_from_another_process(admin_server: str) -> None:
    fuse = server_module.fuse()
    fuse.admit("agent-steady", amount=100)
    looping = Identity.named("agent-loop").key_id
    headers = {"Authorization": f"Bearer {SERVER_TOKEN}"}
    seen: list[str] = []
    with (
        httpx.Client(base_url=admin_server, timeout=10) as client,
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
                fuse.admit("agent-loop", amount=700_000)  # over the cold-start ceiling
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


def test_the_stream_needs_the_token(admin_server: str) -> None:
    answer = httpx.get(f"{admin_server}/api/stream", timeout=10)
    assert answer.status_code == 401
    page = httpx.get(f"{admin_server}/", timeout=10)
    assert page.status_code == 200 and "tokenfuse" in page.text
