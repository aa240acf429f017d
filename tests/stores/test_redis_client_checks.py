"""A client the caller gives is checked once, at first use, against the decision budget.

redis-py's defaults (5 s timeouts, ten retries, a pool that fails at once when full) can hold
one decision for a minute on a blackholed server or fail a burst open. The store never
changes a client it was given; it says, once, what to change.
"""

from __future__ import annotations

import logging
from urllib.parse import urlparse

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from tokenfuse._stores.ops import Gate
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_budget import client_advice

pytestmark = pytest.mark.redis


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_redis_py_defaults_are_named_once_with_the_fix(
    redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = urlparse(redis_url)
    client = redis.Redis(host=url.hostname or "", port=url.port or 6379, db=int(url.path[1:]))
    store = RedisStore(client, prefix=redis_prefix)
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        store.run(Gate("k"))
        store.run(Gate("k"))
    [warning] = warnings_of(caplog)
    assert "socket_timeout=5 lets a dead or blackholed server hold each decision 5 s" in warning
    assert "use 0.25" in warning
    assert "10 retries repeat that wait" in warning
    assert "BlockingConnectionPool(max_connections=50, timeout=2.0)" in warning
    assert client.get_connection_kwargs()["socket_timeout"] == 5  # the caller's, unchanged
    client.close()


async def test_asyncio_client_is_checked_too(
    redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=None)
    store = RedisStore(client, prefix=redis_prefix)
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        await store.arun(Gate("k"))
    [warning] = warnings_of(caplog)
    assert "socket_timeout=None lets a dead or blackholed server hold each decision for ever" in (
        warning
    )
    await client.aclose()


def test_a_client_within_the_budget_passes_silently(
    redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    pool = redis.BlockingConnectionPool.from_url(
        redis_url, max_connections=20, timeout=0.2, socket_timeout=0.1,
        socket_connect_timeout=0.1, retry=Retry(NoBackoff(), 1),
    )  # fmt: skip
    client = redis.Redis(connection_pool=pool)
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        RedisStore(client, prefix=redis_prefix).run(Gate("k"))
    assert warnings_of(caplog) == []
    client.close()
    pool.disconnect()


@pytest.mark.parametrize(
    ("pool", "advice"),
    [
        pytest.param(redis.ConnectionPool(max_connections=10), "non-blocking", id="plain"),
        pytest.param(redis.BlockingConnectionPool(timeout=None), "for ever", id="endless-wait"),
        pytest.param(redis.BlockingConnectionPool(timeout=20), "20 s", id="long-wait"),
    ],
)
def test_pool_kinds(pool: redis.ConnectionPool, advice: str) -> None:
    assert advice in client_advice(redis.Redis(connection_pool=pool))[-1]


def test_the_clients_from_url_build_keep_the_budget(redis_url: str) -> None:
    store = RedisStore.from_url(redis_url)
    assert store._clients._make_sync is not None and store._clients._make_async is not None
    sync_client, async_client = store._clients._make_sync(), store._clients._make_async()
    assert client_advice(sync_client) == client_advice(async_client) == []
    sync_client.close()


@pytest.mark.cluster
def test_cluster_clients_are_checked(cluster_url: str) -> None:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    client = RedisCluster.from_url(cluster_url)
    advice = client_advice(client)
    assert "socket_timeout=5 " in advice[0]
    assert "connection_pool_class=partial(BlockingConnectionPool, timeout=2.0)" in advice[-1]
    client.close()
    built = RedisStore.from_url(cluster_url, cluster=True)._clients
    assert built._make_sync is not None and built._make_async is not None
    own, own_async = built._make_sync(), built._make_async()
    assert client_advice(own) == client_advice(own_async) == []
    assert isinstance(own_async, AsyncRedisCluster)
    own.close()
