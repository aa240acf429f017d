"""Failing closed on a dead Redis: callers get a generic 503, the log gets the detail.

The store's error names the server's host and port; that is for the operator, not for
whoever is calling the API.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from tests.middleware.apps import Call
from tests.middleware.servers import free_port
from tokenfuse._middleware import inbound_fuse

AUTH = {"Authorization": "Bearer sk-test-closed-0001"}


def test_the_503_body_names_no_server_and_the_log_does(
    serve: Callable[..., Call], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenfuse import _throttle as throttle
    from tokenfuse._middleware import reply as reply_module
    from tokenfuse._stores.redis import RedisStore

    # The log throttle is per process: start this test with a fresh one.
    monkeypatch.setattr(reply_module, "_unavailable_log", throttle.Throttle(1.0))

    port = free_port()
    store = RedisStore.from_url(f"redis://127.0.0.1:{port}/0", prefix="tf-mw-closed")
    call = serve(fuse=inbound_fuse(store, fail_closed=True), closing=store)

    with caplog.at_level(logging.WARNING):
        replies = [call("POST", "/tools/refund", AUTH) for _ in range(5)]

    assert [reply.status for reply in replies] == [503] * 5
    for reply in replies:
        assert reply.json() == {
            "type": "store_unavailable",
            "message": "the rate limiter cannot decide right now; retry shortly",
            "retry_after": 1,
        }
        assert str(port) not in reply.body.decode()
    # "with 503": the server's port may hold the digits 503 too (it did: 57503)
    failing = "failing closed with 503"
    failing_closed = [r.getMessage() for r in caplog.records if failing in r.getMessage()]
    assert len(failing_closed) == 1  # one line a second, not one per request
    assert f"127.0.0.1:{port}" in failing_closed[0]
