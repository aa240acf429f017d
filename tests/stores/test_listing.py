"""Listing keys and reading raw state: every backend pages through a prefix, each key once.

``ListKeys`` is what an admin page and the CLI read; it must find every key without any
write on the hot path, on one server and on every primary of a cluster.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import pytest
import redis
import redis.cluster

from tests.conftest import Clock
from tests.stores.conftest import Backend
from tokenfuse import BucketPolicy, VelocityPolicy
from tokenfuse._core.status import status_of
from tokenfuse._stores.memory import MemoryStore
from tokenfuse._stores.ops import (
    Admit,
    KeyPage,
    KeyState,
    ListKeys,
    ReadState,
    ReadStatus,
    Record,
)
from tokenfuse._stores.redis import RedisStore

OPEN = VelocityPolicy(cold_start_limit=None)
BUCKET = BucketPolicy(rate=1, capacity=10)


async def collect(
    run: Callable[[ListKeys], Awaitable[KeyPage]], prefix: str, count: int
) -> list[KeyState]:
    """Every page of the listing; fails if it does not end within a bound."""
    states: list[KeyState] = []
    cursor: str | None = ""
    for _ in range(10_000):
        page = await run(ListKeys(prefix, cursor or "", count))
        states.extend(page.states)
        cursor = page.cursor
        if cursor is None:
            return states
    raise AssertionError("the listing never ended")


async def test_a_listing_pages_through_every_key_of_its_prefix_once(backend: Backend) -> None:
    wanted = {f"a:{n:02d}" for n in range(23)}
    for key in sorted(wanted):
        await backend.run(Record(key, 10.0 + int(key[2:]), OPEN))
    for n in range(5):
        await backend.run(Record(f"b:{n}", 1.0, OPEN))

    states = await collect(backend.run, "a:", count=4)

    keys = [state.key for state in states]
    assert len(keys) == len(set(keys))  # each key once
    assert set(keys) == wanted  # and no key of another prefix
    for state in states:
        assert state.velocity is not None and state.bucket is None
        assert state.velocity.minute_amount == 10.0 + int(state.key[2:])
        assert state.now == backend.clock.now


async def test_read_state_is_the_state_status_is_computed_from(backend: Backend) -> None:
    await backend.run(Admit("k", 1.0, 300.0, OPEN, BUCKET))
    backend.clock.advance(7)
    await backend.run(Admit("k", 1.0, 200.0, OPEN, BUCKET))

    state = await backend.run(ReadState("k"))
    status = await backend.run(ReadStatus("k", OPEN, BUCKET))

    assert state.key == "k" and state.now == backend.clock.now
    assert state.velocity is not None and state.bucket is not None
    assert sum(state.velocity.amounts) == 500.0
    viewed = status_of("k", state.velocity, state.bucket, state.now, OPEN, BUCKET)
    assert viewed == status
    assert (status.rate, status.bucket_level) == (500.0, 9.0)  # 10 - 1, refilled, - 1


async def test_an_unknown_key_reads_as_no_state(backend: Backend) -> None:
    state = await backend.run(ReadState("nobody"))
    assert (state.velocity, state.bucket) == (None, None)
    assert (await backend.run(ListKeys("nobody"))).states == []


def test_memory_lists_only_live_keys_and_holds_copies(clock: Clock) -> None:
    store = MemoryStore(clock=clock, ttl=60)
    store.run(Record("a:old", 1.0, OPEN))
    clock.advance(61)
    store.run(Record("a:new", 5.0, OPEN))

    [state] = store.run(ListKeys("a:")).states

    assert state.key == "a:new"
    assert state.velocity is not None
    state.velocity.amounts[0] = 1e9  # a copy: the store's own state is untouched
    assert store.run(ReadStatus("a:new", OPEN, None)).rate == 5.0


@pytest.mark.redis
def test_redis_listing_reads_binary_state_through_a_decoding_client(redis_url: str) -> None:
    """A client built with decode_responses=True still gets the packed state as bytes."""
    prefix = f"tf-ls-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        store = RedisStore(client, prefix=prefix)
        store.run(Record("x:1", 42.0, OPEN))
        [state] = store.run(ListKeys("x:")).states
        assert state.velocity is not None and state.velocity.minute_amount == 42.0
    finally:
        client.delete(*client.scan_iter(match=f"{prefix}:*"))
        client.close()


@pytest.mark.cluster
@pytest.mark.parametrize("face", ["sync", "async"])
def test_cluster_listing_finds_the_keys_of_every_primary(cluster_url: str, face: str) -> None:
    prefix = f"tf-ls-{uuid.uuid4().hex[:8]}"
    raw = redis.cluster.RedisCluster.from_url(cluster_url)
    store = RedisStore.from_url(cluster_url, prefix=prefix, cluster=True)
    try:
        wanted = {f"c:{n}" for n in range(40)}
        for key in wanted:
            store.run(Record(key, 3.0, OPEN))
        owners = {raw.get_node_from_key(f"{prefix}:{{{key}}}").name for key in wanted}
        primaries = {node.name for node in raw.get_primaries()}
        assert owners == primaries  # the keys really are spread over every primary

        async def listed() -> list[KeyState]:
            async def sync_face(op: ListKeys) -> KeyPage:
                return store.run(op)

            try:
                return await collect(store.arun if face == "async" else sync_face, "c:", 7)
            finally:
                await store.aclose()

        states = asyncio.run(listed())
        assert sorted(state.key for state in states) == sorted(wanted)
    finally:
        for key in raw.scan_iter(match=f"{prefix}:*"):
            raw.delete(key)
        store.close()
        raw.close()
