"""Drill: 400 decisions at once from one caller never turn into fail-open.

A connection pool that runs out must make decisions wait (back-pressure), not fail them open:
a single caller sending a burst would otherwise get through as many calls as the pool is
short of connections. Each case sends 400 concurrent decisions for one key on a real Redis
and checks that the bucket (capacity 50) admitted no more than capacity + rate x elapsed,
with no decision degraded.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.middleware.servers import free_port, running
from tests.stores.conftest import all_at_once
from tokenfuse import BucketPolicy, Fuse
from tokenfuse._stores.redis import RedisStore

pytestmark = pytest.mark.redis
httpx = pytest.importorskip("httpx")

BURST = 400
CAPACITY = 50
RATE = 1.0  # per second: the refill during a burst of a second or two is a token or two
BUCKET = BucketPolicy(rate=RATE, capacity=CAPACITY)


def assert_contained(admitted: int, degraded: int, elapsed: float, events: object = None) -> None:
    print(f"{admitted}/{BURST} admitted in {elapsed:.2f} s, {degraded} degraded")  # -rP
    assert degraded == 0, f"{degraded} of {BURST} decisions failed open: {events}"
    assert CAPACITY <= admitted <= CAPACITY + RATE * elapsed + 1e-9, (
        f"{admitted} of {BURST} admitted in {elapsed:.2f} s"
    )


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def post(connection: Connection, port: int, path: str, headers: dict[str, str]) -> int:
    """One request on an open connection of its own; its status code.

    Plain sockets rather than an HTTP client: the connections are opened before the burst, so
    the 400 requests reach the server at once and the client's own cost stays out of it.
    """
    reader, writer = connection
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Length: 0"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    try:
        writer.write("\r\n".join([*lines, "Connection: close", "", ""]).encode())
        await writer.drain()
        status_line = await reader.readline()
        await reader.read()  # to the end: the server closes the connection
    finally:
        writer.close()
    return int(status_line.split()[1])


async def test_uvicorn_app_on_redis_store(redis_url: str, redis_prefix: str) -> None:
    port = free_port()
    env = {
        "TOKENFUSE_REDIS_URL": redis_url,
        "BURST_PREFIX": redis_prefix,
        "BURST_RATE": str(RATE),
        "BURST_CAPACITY": str(CAPACITY),
    }
    args = ["-m", "uvicorn", "tests.drills.burst_app:app", "--port", str(port)]
    args += ["--log-level", "warning", "--backlog", "4096"]
    auth = {"Authorization": "Bearer sk-burst-drill-0001"}
    with running(args, port, env):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            # Connect the app's store and load its scripts before the burst.
            await client.post("/warm-up", headers={"X-API-Key": "warm-up"})
            connections = await asyncio.gather(
                *(asyncio.open_connection("127.0.0.1", port) for _ in range(BURST))
            )
            started = time.monotonic()
            statuses = await asyncio.gather(
                *(post(connection, port, "/tools/refund", auth) for connection in connections)
            )
            elapsed = time.monotonic() - started
            stats = (await client.get("/stats")).json()
    assert set(statuses) <= {200, 429}
    admitted = statuses.count(200)
    assert stats["served"] == admitted + 1  # and the warm-up
    assert_contained(admitted, stats["degraded"], elapsed, stats["events"])


def test_sync_threads_on_one_store(redis_url: str, redis_prefix: str) -> None:
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    fuse = Fuse(store, velocity=None, bucket=BUCKET)
    fuse.gate("warm-up")  # connect and load the scripts before the burst
    started = time.monotonic()
    decisions = all_at_once(lambda: fuse.admit("agent"), BURST)
    elapsed = time.monotonic() - started
    store.close()
    admitted = sum(d.allowed for d in decisions)
    assert_contained(admitted, sum(d.degraded for d in decisions), elapsed)


async def test_asyncio_tasks_on_one_store(redis_url: str, redis_prefix: str) -> None:
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    fuse = Fuse(store, velocity=None, bucket=BUCKET)
    await fuse.agate("warm-up")
    started = time.monotonic()
    decisions = await asyncio.gather(*(fuse.aadmit("agent") for _ in range(BURST)))
    elapsed = time.monotonic() - started
    await store.aclose()
    admitted = sum(d.allowed for d in decisions)
    assert_contained(admitted, sum(d.degraded for d in decisions), elapsed)
