"""A full connection pool is back-pressure, not an outage, on a real Redis.

A decision that finds every pooled connection busy waits for one; if none comes free in
time it is counted as ``pool_exhausted``, reported as its own event, and never moves the
back-off that protects callers from a dead server (the server is fine).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.stores.conftest import all_at_once, unique_prefix
from tokenfuse import BucketPolicy, Fuse, FuseEvent
from tokenfuse._errors import StoreBusy
from tokenfuse._health import StoreHealth
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_budget import POOL_WAIT, pool_exhausted

BUCKET = BucketPolicy(rate=1, capacity=50)


def one_connection_fuse(url: str, prefix: str, events: list[FuseEvent], **kwargs: Any) -> Fuse:
    # Every gate a round trip (no open-key view): these tests are about the pool it waits on.
    store = RedisStore.from_url(url, prefix=prefix, max_connections=1, open_keys=False)
    return Fuse(store, velocity=None, bucket=BUCKET, on_event=events.append,
                health=StoreHealth(threshold=3), **kwargs)  # fmt: skip


def shorten_wait(pool: Any) -> None:
    """The pool built by from_url, with its wait cut from POOL_WAIT to keep the test quick."""
    assert pool.timeout == POOL_WAIT
    pool.timeout = 0.05


@pytest.mark.redis
def test_a_full_pool_is_counted_as_back_pressure_and_never_backs_off(
    redis_url: str, redis_prefix: str
) -> None:
    events: list[FuseEvent] = []
    fuse = one_connection_fuse(redis_url, redis_prefix, events)
    assert not fuse.admit("agent").degraded
    pool = fuse.store._clients._sync.connection_pool  # type: ignore[union-attr]
    shorten_wait(pool)
    held = pool.get_connection()  # another caller holds the only connection
    decisions = [fuse.admit("agent") for _ in range(5)]
    assert all(d.allowed and d.degraded for d in decisions)
    assert fuse.health.counts.pool_exhausted == 5
    assert fuse.health.counts.failed == fuse.health.counts.skipped == 0
    assert [e.kind for e in events] == ["pool_exhausted"]  # logged once, not per decision
    assert fuse.health.available()  # five in a row, and still no back-off
    pool.release(held)
    assert not fuse.admit("agent").degraded  # at once: nothing to recover from
    assert [e.kind for e in events] == ["pool_exhausted"]  # no store_recovered
    fuse.store.close()  # type: ignore[union-attr]


@pytest.mark.redis
async def test_async_a_full_pool_is_back_pressure(redis_url: str, redis_prefix: str) -> None:
    events: list[FuseEvent] = []
    fuse = one_connection_fuse(redis_url, redis_prefix, events)
    assert not (await fuse.aadmit("agent")).degraded
    pool = fuse.store._clients._async.connection_pool  # type: ignore[union-attr]
    shorten_wait(pool)
    held = await pool.get_connection()
    decisions = [await fuse.aadmit("agent") for _ in range(5)]
    assert all(d.degraded for d in decisions)
    assert (fuse.health.counts.pool_exhausted, fuse.health.counts.failed) == (5, 0)
    assert [e.kind for e in events] == ["pool_exhausted"]
    await pool.release(held)
    assert not (await fuse.aadmit("agent")).degraded
    await fuse.store.aclose()  # type: ignore[union-attr]


@pytest.mark.redis
def test_fail_closed_raises_store_busy(redis_url: str, redis_prefix: str) -> None:
    fuse = one_connection_fuse(redis_url, redis_prefix, [], fail_closed=True)
    fuse.gate("agent")
    pool = fuse.store._clients._sync.connection_pool  # type: ignore[union-attr]
    shorten_wait(pool)
    held = pool.get_connection()
    with pytest.raises(StoreBusy):
        fuse.gate("agent")
    pool.release(held)
    fuse.store.close()  # type: ignore[union-attr]


@pytest.mark.redis
def test_a_callers_own_blocking_pool_is_recognized_too(redis_url: str) -> None:
    pool = redis.BlockingConnectionPool.from_url(redis_url, max_connections=1, timeout=0.05)
    client = redis.Redis(connection_pool=pool)
    held = pool.get_connection()
    with pytest.raises(redis.ConnectionError) as caught:
        client.ping()
    assert pool_exhausted(caught.value)
    pool.release(held)
    pool.disconnect()


@pytest.mark.redis
def test_a_dead_server_is_no_back_pressure(free_port: int) -> None:
    with pytest.raises(redis.ConnectionError) as caught:
        redis.Redis(port=free_port, socket_connect_timeout=0.2, retry=None).ping()
    assert not pool_exhausted(caught.value)


# -- the asyncio pool: the plain way while a connection is free, in turn once calls wait -----


async def turns(predicate: Callable[[], bool]) -> None:
    """Let the other tasks run until ``predicate`` holds (scheduling, not timing)."""
    for _ in range(1000):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("the other tasks never got there")


@pytest.mark.redis
async def test_async_a_burst_on_a_small_pool_waits_its_turn(
    redis_url: str, redis_prefix: str
) -> None:
    """200 decisions at once on 2 connections: the first take the free ones the plain way,
    the rest wait; no decision fails open, and a waiter's release wakes the next one."""
    events: list[FuseEvent] = []
    store = RedisStore.from_url(redis_url, prefix=redis_prefix, max_connections=2,
                                open_keys=False)  # fmt: skip
    fuse = Fuse(store, velocity=None, bucket=BucketPolicy(rate=1, capacity=1000),
                on_event=events.append)  # fmt: skip
    try:
        decisions = await asyncio.gather(*(fuse.aadmit("agent") for _ in range(200)))
        assert sum(d.degraded for d in decisions) == 0, [(e.kind, e.detail) for e in events]
        assert fuse.health.counts.pool_exhausted == 0
        pool = store._clients._async.connection_pool  # type: ignore[union-attr]
        assert len(pool._available_connections) + len(pool._in_use_connections) <= 2
    finally:
        await store.aclose()


@pytest.mark.redis
async def test_async_a_connection_taken_meanwhile_sends_the_call_to_wait(
    redis_url: str, redis_prefix: str
) -> None:
    """A call found the one connection free, then waited for the pool's lock while another
    took it: it waits for the connection instead of failing open at once."""
    events: list[FuseEvent] = []
    fuse = one_connection_fuse(redis_url, redis_prefix, events)
    assert not (await fuse.aadmit("agent")).degraded
    pool = fuse.store._clients._async.connection_pool  # type: ignore[union-attr]
    async with pool._lock:  # the fast way's lock, held: the call stops there
        call = asyncio.ensure_future(fuse.aadmit("agent"))
        await turns(lambda: pool._lock._waiters)
        held = pool.get_available_connection()  # taken meanwhile
    await turns(lambda: pool._waiting == 1)  # on the blocking way now, waiting
    assert not call.done()
    await pool.release(held)
    decision = await call
    assert not decision.degraded and fuse.health.counts.pool_exhausted == 0, events
    await fuse.store.aclose()  # type: ignore[union-attr]


@pytest.mark.redis
async def test_async_a_waiter_that_came_during_a_plain_release_is_woken(
    redis_url: str, redis_prefix: str
) -> None:
    """A connection released the plain way (nobody waited) while a call began to wait: the
    release wakes it, or it would sit out the pool's whole wait and fail open."""
    events: list[FuseEvent] = []
    fuse = one_connection_fuse(redis_url, redis_prefix, events)
    assert not (await fuse.aadmit("agent")).degraded
    pool = fuse.store._clients._async.connection_pool  # type: ignore[union-attr]
    held = await pool.get_connection()
    async with pool._lock:  # the plain release stops at the pool's lock
        release = asyncio.ensure_future(pool.release(held))
        await turns(lambda: pool._lock._waiters)
        call = asyncio.ensure_future(fuse.aadmit("agent"))
        await turns(lambda: pool._waiting == 1)  # no connection free: it waits
    await release
    decision = await asyncio.wait_for(call, POOL_WAIT * 2)
    assert not decision.degraded and fuse.health.counts.pool_exhausted == 0, events
    await fuse.store.aclose()  # type: ignore[union-attr]


# -- bursts on the cluster, whose asyncio client has no blocking pool of its own -------------

BURST = 400


def burst_fuse(store: RedisStore) -> tuple[Fuse, list[FuseEvent]]:
    events: list[FuseEvent] = []
    return Fuse(store, velocity=None, bucket=BUCKET, on_event=events.append), events


def assert_contained(decisions: list[Any], events: list[FuseEvent]) -> None:
    assert sum(d.degraded for d in decisions) == 0, [(e.kind, e.detail) for e in events]
    # Capacity + 1/s over a burst of seconds; a command the cluster client retried after a
    # timeout may have spent a token twice (fewer admitted, never more).
    assert 40 <= sum(d.allowed for d in decisions) <= 50 + 30


@pytest.fixture
def cluster_prefix(cluster_url: str) -> Iterator[str]:
    from redis.cluster import RedisCluster

    name = unique_prefix()
    yield name
    client = RedisCluster.from_url(cluster_url)
    for key in client.scan_iter(match=f"{name}:*", target_nodes=RedisCluster.ALL_NODES):
        client.delete(key)
    client.close()


@pytest.mark.cluster
async def test_asyncio_cluster_burst_takes_turns(cluster_url: str, cluster_prefix: str) -> None:
    store = RedisStore.from_url(cluster_url, cluster=True, prefix=cluster_prefix,
                                max_connections=10)  # fmt: skip
    fuse, events = burst_fuse(store)
    try:
        await fuse.agate("agent")  # the slot map and the scripts, loaded before the burst
        decisions = await asyncio.gather(*(fuse.aadmit("agent") for _ in range(BURST)))
        assert_contained(decisions, events)
    finally:
        await store.aclose()


@pytest.mark.cluster
def test_sync_cluster_burst_waits_for_connections(cluster_url: str, cluster_prefix: str) -> None:
    store = RedisStore.from_url(cluster_url, cluster=True, prefix=cluster_prefix,
                                max_connections=10)  # fmt: skip
    fuse, events = burst_fuse(store)
    fuse.gate("agent")
    decisions = all_at_once(lambda: fuse.admit("agent"), BURST)
    store.close()
    assert_contained(decisions, events)
