"""``ListKeys``: every store lists the keys under a start, page by page, with each one's status
as ``ReadStatus`` gives it; Redis walks every primary of a cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from tests.conftest import Clock
from tests.stores.conftest import Backend, unique_prefix
from tokenfuse import BucketPolicy, MemoryStore, VelocityPolicy
from tokenfuse._core.status import Status
from tokenfuse._stores.ops import Admit, Configure, KeyPage, ListKeys, ReadStatus, Record
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_codec import key_of

POLICY = VelocityPolicy(limit=1000, cooldown=30)
BUCKET = BucketPolicy(rate=0.1, capacity=5)


async def every_page(backend: Backend, start: str, count: int) -> tuple[list[Status], int]:
    """Every status under ``start``, walking the pages to the end; and how many pages."""
    statuses: list[Status] = []
    cursor, pages = "", 0
    while True:
        page: KeyPage = await backend.run(ListKeys(start, POLICY, BUCKET, cursor, count))
        statuses += page.statuses
        pages += 1
        cursor = page.cursor
        if not cursor:
            return statuses, pages
        assert pages < 100


async def test_every_key_under_the_start_is_listed_once_with_its_status(
    backend: Backend, clock: Clock
) -> None:
    outbound = [f"default:{n:032x}" for n in range(23)]
    for n, key in enumerate(outbound):
        await backend.run(Record(key, 10.0 * (n + 1), POLICY))
    await backend.run(Record(outbound[0], 5_000, POLICY))  # trips: open for 30 s
    await backend.run(Configure(outbound[1], limit=42.0))
    inbound = "inbound:" + "f" * 32
    await backend.run(Admit(inbound, cost=2, amount=1, velocity=POLICY, bucket=BUCKET))
    clock.advance(5)

    listed, pages = await every_page(backend, "default:", count=5)
    assert sorted(status.key for status in listed) == outbound  # not the inbound key
    assert len({status.key for status in listed}) == len(listed)
    assert pages >= 2  # paged, not all at once
    for status in listed:
        assert status == await backend.run(ReadStatus(status.key, POLICY, BUCKET))
    by_key = {status.key: status for status in listed}
    assert by_key[outbound[0]].open_until == clock.now + 25
    assert by_key[outbound[1]].limit == 42.0
    assert by_key[outbound[5]].rate == 60.0

    (only,), _ = await every_page(backend, "inbound:", count=5)
    assert (only.key, only.bucket_level) == (inbound, 3.5)  # 5 - 2, refilled 5 s x 0.1


async def test_a_start_with_the_beginning_of_a_key_id_narrows_the_list(backend: Backend) -> None:
    keys = ["default:abc" + "0" * 29, "default:abd" + "0" * 29, "default:abc1" + "0" * 28]
    for key in keys:
        await backend.run(Record(key, 1.0, POLICY))
    listed, _ = await every_page(backend, "default:abc", count=50)
    assert sorted(status.key for status in listed) == sorted([keys[0], keys[2]])
    nothing, _ = await every_page(backend, "default:0", count=50)
    assert nothing == []


async def test_glob_characters_in_the_start_match_only_themselves(backend: Backend) -> None:
    await backend.run(Record("a*b:x", 1.0, POLICY))
    await backend.run(Record("aXb:y", 1.0, POLICY))
    listed, _ = await every_page(backend, "a*b:", count=50)
    assert [status.key for status in listed] == ["a*b:x"]


def test_the_memory_store_does_not_list_expired_keys(clock: Clock) -> None:
    # (Redis expires keys by its own clock, which the simulated one does not move.)
    store = MemoryStore(clock=clock, ttl=3600)
    store.run(Record("default:old", 1.0, POLICY))
    clock.advance(3601)
    store.run(Record("default:new", 1.0, POLICY))
    page = store.run(ListKeys("default:", POLICY, None))
    assert ([status.key for status in page.statuses], page.cursor) == (["default:new"], "")


# -- a real cluster: one SCAN walk per primary -------------------------------------------------


@pytest.fixture
def cluster(cluster_url: str) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(cluster_url)
    yield client
    client.close()


@pytest.mark.cluster
async def test_a_cluster_lists_the_keys_of_every_primary(
    cluster: RedisCluster, cluster_url: str, clock: Clock
) -> None:
    prefix = unique_prefix()
    keys = [f"default:{n:032x}" for n in range(40)]
    store = RedisStore(cluster, prefix=prefix, clock=clock)
    try:
        for key in keys:
            store.run(Record(key, 7.0, POLICY))
        owners = {cluster.get_node_from_key(key_of(prefix, key)).name for key in keys}
        assert len(owners) == 3
        walked: list[str] = []
        cursor = ""
        for _ in range(100):
            page = store.run(ListKeys("default:", POLICY, None, cursor, 6))
            walked += [status.key for status in page.statuses]
            cursor = page.cursor
            if not cursor:
                break
        assert sorted(set(walked)) == keys

        async_client = AsyncRedisCluster.from_url(cluster_url)
        async_store = RedisStore(async_client, prefix=prefix, clock=clock)
        try:
            page = await async_store.arun(ListKeys("default:", POLICY, None, "", 1000))
            statuses = page.statuses
            while page.cursor:
                page = await async_store.arun(ListKeys("default:", POLICY, None, page.cursor, 1000))
                statuses += page.statuses
            assert sorted({status.key for status in statuses}) == keys
            assert {status.rate for status in statuses} == {7.0}
        finally:
            await async_client.aclose()
    finally:
        for key in keys:
            cluster.delete(key_of(prefix, key))
