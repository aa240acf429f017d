"""Through RedisStore: a trip seen by one process's transport refuses the other's."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.conftest import Clock
from tokenfuse import Fuse, Identity, LoopSuspected
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_codec import key_of
from tokenfuse._transport import AsyncFuseTransport, FuseTransport

from .bodies import CASES
from .conftest import QUICK, ChunkServer

pytestmark = pytest.mark.redis
CASE = CASES["anthropic-messages"]  # 200 tokens a call
MAX_ROUNDS = 100  # a trip is due after 25 rounds of two calls; far more means it never comes


def process_fuse(redis_url: str, prefix: str, clock: Clock) -> Fuse:
    """What each process builds: its own client and Fuse, on the same Redis."""
    return Fuse(RedisStore.from_url(redis_url, prefix=prefix, clock=clock), velocity=QUICK)


def store_of(fuse: Fuse) -> RedisStore:
    assert isinstance(fuse.store, RedisStore)
    return fuse.store


def learned(fuse: Fuse, key: str) -> None:
    """Wait (bounded) until the fuse's open-key view has heard that ``key`` opened elsewhere:
    another process learns a trip within milliseconds, not at once."""
    view = store_of(fuse).open_keys
    assert view is not None
    full = key_of(store_of(fuse).prefix, fuse._key(Identity.of(key)))
    assert view.wait_until(lambda v: not v.trusted or full in v._open, 5.0)


def train(fuse: Fuse, clock: Clock) -> None:
    for _ in range(6):
        fuse.record("agent-1", 1_000)
        clock.advance(60)


def test_a_trip_in_one_process_refuses_the_other(
    lib: ModuleType, redis_url: str, redis_prefix: str, clock: Clock
) -> None:
    one, two = (process_fuse(redis_url, redis_prefix, clock) for _ in range(2))
    train(one, clock)
    server = ChunkServer(lib, CASE)
    first = lib.Client(transport=FuseTransport(server.transport(), fuse=one, key="agent-1"))
    second = lib.Client(transport=FuseTransport(server.transport(), fuse=two, key="agent-1"))
    for _ in range(MAX_ROUNDS):  # both processes loop; together they trip the shared key
        reports = [client.post(CASE.url).extensions["tokenfuse"] for client in (first, second)]
        if any(report.tripped for report in reports):
            break
    else:
        pytest.fail(f"the shared key did not trip in {2 * MAX_ROUNDS} calls")
    sent = len(server.requests)
    for fuse in (one, two):
        learned(fuse, "agent-1")
    for client in (first, second):
        with pytest.raises(LoopSuspected):
            client.post(CASE.url)
    assert len(server.requests) == sent
    assert sent == 50  # the same 11,000 tokens/min as on the embedded store
    for fuse in (one, two):
        store_of(fuse).close()


async def test_async_transport_on_redis(
    lib: ModuleType, redis_url: str, redis_prefix: str, clock: Clock
) -> None:
    fuse = process_fuse(redis_url, redis_prefix, clock)
    server = ChunkServer(lib, CASES["anthropic-stream"], how="random")
    transport = AsyncFuseTransport(server.transport(), fuse=fuse, key="agent-1")
    async with lib.AsyncClient(transport=transport) as client:
        response = await client.post(CASE.url)
    assert response.extensions["tokenfuse"].record.rate == 40
    assert (await fuse.astatus("agent-1")).rate == 40
    await store_of(fuse).aclose()
