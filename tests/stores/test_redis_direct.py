"""EVALSHA sent straight on a pooled connection (``redis_direct``), on real redis-servers of
the tests' own (they flush scripts and kill connections): what ``execute_command`` handles,
handled the same; and every client it must not touch left to ``execute_command``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.backoff import NoBackoff

from tests.stores.conftest import OwnRedis
from tokenfuse import VelocityPolicy
from tokenfuse._errors import StoreBusy, StoreUnavailable
from tokenfuse._stores import redis_direct
from tokenfuse._stores.ops import Gate, Record
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_budget import AsyncBlockingPool, SyncBlockingPool

pytestmark = pytest.mark.redis

CEILING = VelocityPolicy(limit=1000, cooldown=30)


def store_on(server: OwnRedis, **options: Any) -> RedisStore:
    """A store on one connection: a connection not given back makes the next call
    ``StoreBusy``."""
    options = {"max_connections": 1, **options}
    return RedisStore.from_url(server.url, prefix="direct", open_keys=False, **options)


def direct(script: Any) -> bool:
    """Whether a registered script sends its EVALSHA on the pool directly."""
    return script.send.func in (redis_direct._send, redis_direct._asend)


def kill_each_connection_handed_out(pool: Any, admin: redis.Redis) -> list[int]:
    """After the pool hands out a connection (its health check passed), the server kills
    every client connection but the admin's: the command is sent on a dead connection."""
    killed: list[int] = []
    get = pool.get_connection

    def kill() -> None:
        killed.append(int(admin.client_kill_filter(_type="normal", skipme=True)))

    if isinstance(pool, AsyncBlockingPool):  # a decision takes its connection the lean way
        take = pool.take

        async def take_then_kill() -> Any:
            connection = await take()
            kill()
            return connection

        pool.take = take_then_kill  # type: ignore[method-assign]
    elif isinstance(pool, SyncBlockingPool):
        sync_take = pool.take

        def sync_take_then_kill() -> Any:
            connection = sync_take()
            kill()
            return connection

        pool.take = sync_take_then_kill  # type: ignore[method-assign]
    elif isinstance(pool, redis.asyncio.ConnectionPool):

        async def aget_then_kill() -> Any:
            connection = await get()
            kill()
            return connection

        pool.get_connection = aget_then_kill  # type: ignore[method-assign]
    else:

        def get_then_kill() -> Any:
            connection = get()
            kill()
            return connection

        pool.get_connection = get_then_kill  # type: ignore[method-assign]
    return killed


@pytest.fixture
def admin(own_redis: OwnRedis) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(own_redis.url) as client:
        yield client


async def test_a_flushed_library_is_loaded_again(own_redis: OwnRedis, admin: redis.Redis) -> None:
    store = store_on(own_redis)
    try:
        store.run(Record("k", 600, CEILING))
        await store.arun(Gate("k"))  # the first uses, which check the server, done
        assert direct(store._clients.sync_scripts()["record"])
        assert direct(store._clients.async_scripts()["gate"])
        admin.function_flush()  # (the EVALSHA fallback's SCRIPT FLUSH: test_redis_functions)
        assert store.run(Record("k", 600, CEILING)).tripped  # both calls counted
        admin.function_flush()
        assert not (await store.arun(Gate("k"))).allowed
    finally:
        await store.aclose()


def test_a_connection_killed_in_use_is_retried_on_a_new_one(
    own_redis: OwnRedis, admin: redis.Redis
) -> None:
    store = store_on(own_redis)
    try:
        store.run(Gate("k"))  # the first use's server check done
        pool = store._clients.sync_client().connection_pool
        killed = kill_each_connection_handed_out(pool, admin)
        assert store.run(Gate("k")).allowed
        assert killed == [1]  # the one connection was killed, the retry reconnected
        assert store.run(Gate("k")).allowed  # and it was given back
    finally:
        store.close()


async def test_async_a_connection_killed_in_use_is_retried_on_a_new_one(
    own_redis: OwnRedis, admin: redis.Redis
) -> None:
    store = store_on(own_redis)
    try:
        await store.arun(Gate("k"))
        pool = store._clients.async_client().connection_pool
        killed = kill_each_connection_handed_out(pool, admin)
        assert (await store.arun(Gate("k"))).allowed
        assert killed == [1]
        assert (await store.arun(Gate("k"))).allowed
    finally:
        await store.aclose()


def test_without_retries_a_killed_connection_is_unavailable_and_given_back(
    own_redis: OwnRedis, admin: redis.Redis
) -> None:
    store = store_on(own_redis, retry=redis.retry.Retry(NoBackoff(), 0))
    try:
        store.run(Gate("k"))
        pool = store._clients.sync_client().connection_pool
        take = pool.take  # type: ignore[union-attr]
        killed = kill_each_connection_handed_out(pool, admin)
        with pytest.raises(StoreUnavailable) as caught:
            store.run(Gate("k"))
        assert type(caught.value) is StoreUnavailable  # an outage, not a full pool
        assert isinstance(caught.value.__cause__, redis.ConnectionError)
        assert killed == [1]
        pool.take = take  # type: ignore[union-attr]  # no more killing
        assert store.run(Gate("k")).allowed  # the connection was given back
    finally:
        store.close()


async def test_async_without_retries_a_killed_connection_is_unavailable_and_given_back(
    own_redis: OwnRedis, admin: redis.Redis
) -> None:
    store = store_on(own_redis, retry=redis.asyncio.retry.Retry(NoBackoff(), 0))
    try:
        await store.arun(Gate("k"))
        pool = store._clients.async_client().connection_pool
        take = pool.take  # type: ignore[union-attr]
        killed = kill_each_connection_handed_out(pool, admin)
        with pytest.raises(StoreUnavailable) as caught:
            await store.arun(Gate("k"))
        assert type(caught.value) is StoreUnavailable
        assert isinstance(caught.value.__cause__, redis.ConnectionError)
        assert killed == [1]
        pool.take = take  # type: ignore[union-attr]
        assert (await store.arun(Gate("k"))).allowed
    finally:
        await store.aclose()


async def test_a_full_pool_is_store_busy(own_redis: OwnRedis) -> None:
    store = store_on(own_redis)
    try:
        await store.arun(Gate("k"))
        pool = store._clients.async_client().connection_pool
        pool.timeout = 0.05  # type: ignore[union-attr]  # the wait for a free connection
        held = await pool.get_connection()
        with pytest.raises(StoreBusy):
            await store.arun(Gate("k"))
        await pool.release(held)
        assert (await store.arun(Gate("k"))).allowed
    finally:
        await store.aclose()


def counting(calls: list[tuple[Any, ...]], method: Callable[..., Any]) -> Callable[..., Any]:
    def execute_command(self: Any, *args: Any, **options: Any) -> Any:
        calls.append(args[:1])
        return method(self, *args, **options)

    return execute_command


def test_redis_pys_metrics_turned_on_see_every_script_call(
    own_redis: OwnRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(
        redis.Redis, "execute_command", counting(calls, redis.Redis.execute_command)
    )
    store = store_on(own_redis)
    try:
        store.run(Gate("k"))
        calls.clear()  # the first use's server check
        store.run(Gate("k"))
        assert calls == []  # sent directly
        metrics = redis_direct.get_observability_instance()
        monkeypatch.setattr(metrics, "is_enabled", lambda: True)
        store.run(Gate("k"))
        assert calls == [("FCALL",)]
    finally:
        store.close()


def test_a_wrapped_execute_command_sees_every_script_call(
    own_redis: OwnRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, ...]] = []
    original = redis.Redis.execute_command
    traced = functools.wraps(original)(counting(calls, original))  # as instrumentations do
    store = store_on(own_redis)
    try:
        store.run(Gate("k"))
        monkeypatch.setattr(redis.Redis, "execute_command", traced)
        store.run(Gate("k"))
        assert calls == [("FCALL",)]
    finally:
        store.close()


class OwnClient(redis.Redis):
    pass


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        pytest.param(redis.Redis.from_url, True, id="plain"),
        pytest.param(functools.partial(redis.Redis.from_url, single_connection_client=True),
                     False, id="single-connection"),
        pytest.param(OwnClient.from_url, False, id="subclass"),
        pytest.param(redis.asyncio.Redis.from_url, True, id="asyncio-plain"),
        pytest.param(functools.partial(redis.asyncio.Redis.from_url, single_connection_client=True),
                     False, id="asyncio-single-connection"),
    ],
)  # fmt: skip
async def test_only_plain_clients_on_a_pool_are_sent_to_directly(
    make: Callable[[str], Any], expected: bool, own_redis: OwnRedis
) -> None:
    client = make(own_redis.url)
    store = RedisStore(client, prefix="direct", open_keys=False)
    try:
        asyncio_client = isinstance(client, redis.asyncio.Redis)
        for _ in range(2):  # the first use checks the server
            verdict = store.arun(Gate("k")) if asyncio_client else store.run(Gate("k"))
            assert (await verdict if asyncio_client else verdict).allowed
        clients = store._clients
        script = (clients.async_scripts() if asyncio_client else clients.sync_scripts())["gate"]
        assert direct(script) is expected
    finally:
        if isinstance(client, redis.asyncio.Redis):
            await client.aclose()
        else:
            client.close()


@pytest.mark.parametrize(
    ("kind", "sender"),
    [
        (redis.cluster.RedisCluster, redis_direct.sync_sender),
        (redis.asyncio.cluster.RedisCluster, redis_direct.async_sender),
    ],
)
def test_cluster_clients_keep_execute_command(kind: type, sender: Callable[[Any], Any]) -> None:
    client = object.__new__(kind)  # no cluster needed: only its class is looked at

    assert sender(client).func in (redis_direct._through_client, redis_direct._athrough_client)
