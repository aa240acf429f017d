"""Through RedisStore: a trip seen by one process's transport refuses the other's."""

from __future__ import annotations

import uuid
from types import ModuleType

import pytest

from tests.conftest import Clock
from tokenfuse import Fuse, LoopSuspected
from tokenfuse._stores.redis import RedisStore
from tokenfuse._transport import AsyncFuseTransport, FuseTransport

from .bodies import CASES
from .conftest import QUICK, ChunkServer

pytestmark = pytest.mark.redis
CASE = CASES["anthropic-messages"]  # 200 tokens a call


def process_fuse(redis_url: str, prefix: str, clock: Clock) -> Fuse:
    """What each process builds: its own client and Fuse, on the same Redis."""
    return Fuse(RedisStore.from_url(redis_url, prefix=prefix, clock=clock), velocity=QUICK)


def store_of(fuse: Fuse) -> RedisStore:
    assert isinstance(fuse.store, RedisStore)
    return fuse.store


def train(fuse: Fuse, clock: Clock) -> None:
    for _ in range(14):  # a minute is learned once it leaves the 10-minute window
        fuse.record("agent-1", 1_000)
        clock.advance(60)


def test_a_trip_in_one_process_refuses_the_other(
    lib: ModuleType, redis_url: str, clock: Clock
) -> None:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    one, two = process_fuse(redis_url, prefix, clock), process_fuse(redis_url, prefix, clock)
    train(one, clock)
    server = ChunkServer(lib, CASE)
    first = lib.Client(transport=FuseTransport(server.transport(), fuse=one, key="agent-1"))
    second = lib.Client(transport=FuseTransport(server.transport(), fuse=two, key="agent-1"))
    tripped = False
    while not tripped:  # both processes loop; together they trip the shared key
        for client in (first, second):
            report = client.post(CASE.url).extensions["tokenfuse"]
            tripped = tripped or report.tripped
    sent = len(server.requests)
    for client in (first, second):
        with pytest.raises(LoopSuspected):
            client.post(CASE.url)
    assert len(server.requests) == sent
    assert sent == 50  # the same 11,000 tokens/min as on the embedded store
    for fuse in (one, two):
        store_of(fuse).close()


async def test_async_transport_on_redis(lib: ModuleType, redis_url: str, clock: Clock) -> None:
    fuse = process_fuse(redis_url, f"test-{uuid.uuid4().hex[:8]}", clock)
    server = ChunkServer(lib, CASES["anthropic-stream"], how="random")
    transport = AsyncFuseTransport(server.transport(), fuse=fuse, key="agent-1")
    async with lib.AsyncClient(transport=transport) as client:
        response = await client.post(CASE.url)
    assert response.extensions["tokenfuse"].record.rate == 40
    assert (await fuse.astatus("agent-1")).rate == 40
    await store_of(fuse).aclose()
