"""The middleware on a real Redis: shared state across processes, and a Redis that is gone."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import Clock
from tests.middleware.apps import Call
from tests.middleware.servers import free_port, running
from tokenfuse import FREE
from tokenfuse._middleware import CALL_VELOCITY, inbound_fuse

pytestmark = pytest.mark.redis
redis = pytest.importorskip("redis")

AUTH = {"Authorization": "Bearer sk-test-redis-0001"}


def test_burst_and_refill_on_redis(
    serve: Callable[..., Call], redis_url: str, prefix: str, clock: Clock
) -> None:
    from tokenfuse._stores.redis import RedisStore

    store = RedisStore.from_url(redis_url, prefix=prefix, clock=clock)
    call = serve(fuse=inbound_fuse(store, bucket=FREE, velocity=CALL_VELOCITY), closing=store)

    for _ in range(50):
        assert call("POST", "/tools/refund", AUTH).status == 200
    refused = call("POST", "/tools/refund", AUTH)
    assert refused.status == 429
    assert refused.json()["type"] == "quota_exhausted"
    assert refused.headers["ratelimit"] == '"default";r=0;t=1'
    clock.advance(0.1)
    assert call("POST", "/tools/refund", AUTH).status == 200


def test_a_dead_redis_does_not_break_requests(serve: Callable[..., Call]) -> None:
    from tokenfuse._stores.redis import RedisStore

    store = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", prefix="tf-mw-dead")
    call = serve(fuse=inbound_fuse(store), closing=store)

    replies = [call("POST", "/tools/refund", AUTH) for _ in range(20)]

    assert [reply.status for reply in replies] == [200] * 20
    assert all("ratelimit" not in reply.headers for reply in replies)


@pytest.mark.slow
def test_two_processes_sharing_one_redis_enforce_one_bucket(redis_url: str, prefix: str) -> None:
    """An ASGI server (uvicorn) and a WSGI server (werkzeug) in separate processes."""
    httpx = pytest.importorskip("httpx")
    capacity, rate = 30, 0.5
    env = {
        "TOKENFUSE_REDIS_URL": redis_url,
        "SHARED_PREFIX": prefix,
        "SHARED_RATE": str(rate),
        "SHARED_CAPACITY": str(capacity),
        "TOKENFUSE_SECRET": "one-secret-for-every-process-of-the-test",  # one bucket needs it
    }
    asgi_port, wsgi_port = free_port(), free_port()
    uvicorn = ["-m", "uvicorn", "tests.middleware.shared_app:asgi_app", "--port", str(asgi_port)]
    werkzeug = ["-m", "tests.middleware.shared_app", str(wsgi_port)]

    with running(uvicorn, asgi_port, env), running(werkzeug, wsgi_port, env):
        urls = [f"http://127.0.0.1:{port}/tools/refund" for port in (asgi_port, wsgi_port)] * 60
        with httpx.Client(headers=AUTH) as client, ThreadPoolExecutor(4) as pool:
            client.post(urls[0].replace("/tools/refund", "/warm-up"), headers={"X-API-Key": "w"})
            started = time.monotonic()
            replies = list(pool.map(lambda url: (url, client.post(url)), urls))
            elapsed = time.monotonic() - started

    admitted = [url for url, reply in replies if reply.status_code == 200]
    refused = [url for url, reply in replies if reply.status_code == 429]
    assert len(admitted) + len(refused) == len(urls)
    # One bucket: the capacity plus what refilled while the agent kept hammering, no more.
    assert capacity + math.floor(rate * elapsed) - 1 <= len(admitted) <= capacity + rate * elapsed
    for port in (asgi_port, wsgi_port):  # both processes admitted and refused from it
        assert any(f":{port}/" in url for url in admitted)
        assert any(f":{port}/" in url for url in refused)
