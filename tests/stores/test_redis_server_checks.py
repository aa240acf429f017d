"""The server's memory policy, read once at first use, on private redis-servers.

``allkeys-*`` evicts tokenfuse's keys like any other (a tripped key silently closes), and
``noeviction`` with a ``maxmemory`` refuses its writes (every decision fails open): both are
warned about once, with the setting to use. Each test starts its own redis-server with the
policy under test, and stops it by PID.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.stores.conftest import OwnRedis
from tokenfuse import StoreUnavailable
from tokenfuse._stores.ops import Gate
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_server import MemoryPolicy, acheck_server, check_server, memory_advice

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")

Start = Callable[..., OwnRedis]


@pytest.fixture
def start_redis(free_port: int, tmp_path: Path) -> Iterator[Start]:
    servers: list[OwnRedis] = []

    def start(*settings: str) -> OwnRedis:
        server = OwnRedis(free_port, tmp_path, *settings)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    ("policy", "maxmemory", "warned"),
    [
        pytest.param("allkeys-lru", "100mb", "evicts tokenfuse's keys", id="allkeys-lru"),
        pytest.param("allkeys-lfu", "100mb", "evicts tokenfuse's keys", id="allkeys-lfu"),
        pytest.param("allkeys-random", "0", "evicts tokenfuse's keys", id="allkeys-random"),
        pytest.param("noeviction", "100mb", "refuses tokenfuse's writes", id="noeviction-full"),
        pytest.param("noeviction", "0", None, id="noeviction-unbounded"),
        pytest.param("volatile-ttl", "100mb", None, id="volatile-ttl"),
        pytest.param("volatile-lru", "100mb", None, id="volatile-lru"),
    ],
)
def test_policies_that_lose_or_refuse_keys_are_warned_about_once(
    start_redis: Start,
    caplog: pytest.LogCaptureFixture,
    policy: str,
    maxmemory: str,
    warned: str | None,
) -> None:
    server = start_redis("--maxmemory-policy", policy, "--maxmemory", maxmemory)
    store = RedisStore.from_url(server.url)
    with caplog.at_level(logging.INFO, logger="tokenfuse"):
        for _ in range(3):
            store.run(Gate("k"))
    found = warnings_of(caplog)
    if warned is None:
        assert found == []
    else:
        [warning] = found
        assert f"maxmemory-policy {policy}" in warning and warned in warning
        assert "set maxmemory-policy volatile-ttl (or volatile-lru)" in warning
    assert "could not read" not in caplog.text
    store.close()


async def test_both_faces_of_a_store_warn_once(
    start_redis: Start, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_redis("--maxmemory-policy", "allkeys-lru")
    store = RedisStore.from_url(server.url)
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        await store.arun(Gate("k"))
        store.run(Gate("k"))
        await store.arun(Gate("k"))
    assert len(warnings_of(caplog)) == 1
    await store.aclose()


def test_config_renamed_away_falls_back_to_info(
    start_redis: Start, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_redis("--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", "")
    store = RedisStore.from_url(server.url)
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        store.run(Gate("k"))
    [warning] = warnings_of(caplog)
    assert "maxmemory-policy allkeys-lru" in warning
    store.close()


def test_nothing_to_read_is_said_quietly_and_never_fails_a_decision(
    start_redis: Start, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_redis("--rename-command", "CONFIG", "", "--rename-command", "INFO", "")
    store = RedisStore.from_url(server.url)
    with caplog.at_level(logging.INFO, logger="tokenfuse"):
        assert store.run(Gate("k")).allowed
    assert warnings_of(caplog) == []
    assert "could not read the Redis maxmemory-policy" in caplog.text
    store.close()


def test_a_server_that_is_down_at_first_use_is_checked_when_it_answers(
    free_port: int, start_redis: Start, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore.from_url(f"redis://127.0.0.1:{free_port}/0")
    with caplog.at_level(logging.INFO, logger="tokenfuse"), pytest.raises(StoreUnavailable):
        store.run(Gate("k"))
    assert "maxmemory" not in caplog.text  # no second wait on a dead server
    start_redis("--maxmemory-policy", "allkeys-lru")
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        store.run(Gate("k"))
    assert "maxmemory-policy allkeys-lru" in caplog.text
    store.close()


def test_advice_names_the_cluster_node() -> None:
    advice = memory_advice(MemoryPolicy("10.0.0.5:7000", "allkeys-lfu", 0))
    assert advice is not None and advice.startswith("Redis 10.0.0.5:7000 has")


@pytest.mark.cluster
def test_every_cluster_primary_is_read(cluster_url: str, caplog: pytest.LogCaptureFixture) -> None:
    from redis.cluster import RedisCluster

    client = RedisCluster.from_url(cluster_url)
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        found = check_server(client)
    client.close()
    assert len({server.node for server in found}) == 3
    # The shared cluster runs noeviction without maxmemory: nothing to warn about.
    assert {(server.policy, server.maxmemory) for server in found} == {("noeviction", 0)}
    assert warnings_of(caplog) == []


@pytest.mark.cluster
async def test_every_cluster_primary_is_read_async(cluster_url: str) -> None:
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    client = AsyncRedisCluster.from_url(cluster_url)
    found = await acheck_server(client)
    await client.aclose()
    assert len({server.node for server in found}) == 3
