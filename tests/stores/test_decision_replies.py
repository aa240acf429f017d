"""Decisions reply with packed doubles (``redis_codec``, "replies"), which every path a decision
takes reads undecoded: a client built with ``decode_responses=True`` gets the very verdicts a
plain client gets, sync and asyncio, standalone and Cluster, one call or a batch, FCALL or
EVALSHA, and after a flush.  A reply the codec cannot read (a proxy that mangles it) is the
store's failure, on which the fuse fails open, or closed when told to."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from tests.conftest import Clock
from tests.stores.conftest import OwnRedis, delete_prefix, unique_prefix
from tokenfuse import BucketPolicy, Fuse, FuseEvent, StoreUnavailable, VelocityPolicy
from tokenfuse._health import StoreHealth
from tokenfuse._stores import redis_direct
from tokenfuse._stores.ops import Admit, Gate, Lease, Op, Record, RecordBatch, ReturnLease
from tokenfuse._stores.redis import RedisStore

pytestmark = pytest.mark.redis

POLICY = VelocityPolicy(limit=1000, cooldown=60)
BUCKET = BucketPolicy(rate=1, capacity=3)


def decisions(key: str) -> list[Op[Any]]:
    """Every shape of reply: an allowed gate (nothing more), allowed records and admissions,
    leases, a trip, a refusal, and verdicts that are None."""
    return [
        Gate(key),
        Record(key, 300, POLICY),
        RecordBatch(key, (100.0, 50.5), POLICY),
        Admit(key, 1, 1, POLICY, BUCKET),
        Admit(key, 1, 0, None, BUCKET),  # no velocity verdict
        Lease(key, 1, 1, 1, 0, (), POLICY, BUCKET),
        ReturnLease(key, 1, (20.0,), POLICY, BUCKET),  # no trip: None
        Lease(key, 1, 1, 1, 0, (600.0,), POLICY, BUCKET),  # the pending amount trips
        Record(key, 600, POLICY),  # refused: the latch is open
        Gate(key),  # a refusal
        Admit(key, 1, 1, POLICY, None),  # refused by the latch, no bucket verdict
        ReturnLease(key, 0, (), POLICY, None),
    ]


def batches(key: str) -> list[list[Op[Any]]]:
    """The same decisions two by two, as ``run_many`` sends them (one round trip)."""
    ops = decisions(key)
    return [ops[at : at + 2] for at in range(0, len(ops), 2)]


def reference(redis_url: str, clock: Clock) -> tuple[RedisStore, list[Any], list[Any]]:
    """What a plain client (bytes replies) gets for ``decisions``, one at a time and in
    batches, at the same clock."""
    store = RedisStore(redis.Redis.from_url(redis_url), prefix=unique_prefix(), clock=clock,
                       open_keys=False)  # fmt: skip
    single = [store.run(op) for op in decisions("one")]
    many = [store.run_many(batch) for batch in batches("many")]
    return store, single, many


def forget(store: RedisStore, redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        delete_prefix(client, store.prefix)


def sync_clients(url: str) -> dict[str, Callable[[], redis.Redis]]:
    class Subclass(redis.Redis):  # not plain: execute_command
        pass

    return {
        "plain": lambda: redis.Redis.from_url(url, decode_responses=True),
        "subclass": lambda: Subclass.from_url(url, decode_responses=True),
        # execute_command under its lock, and redis-py's Pipeline for a batch
        "single connection": lambda: redis.Redis.from_url(
            url, decode_responses=True, single_connection_client=True
        ),
    }


def async_clients(url: str) -> dict[str, Callable[[], redis.asyncio.Redis]]:
    class Subclass(redis.asyncio.Redis):
        pass

    return {
        "plain": lambda: redis.asyncio.Redis.from_url(url, decode_responses=True),
        "subclass": lambda: Subclass.from_url(url, decode_responses=True),
        "single connection": lambda: redis.asyncio.Redis.from_url(
            url, decode_responses=True, single_connection_client=True
        ),
    }


def _nothing() -> None:
    pass


def sync_run(store: RedisStore, before: Callable[[], Any] = _nothing) -> tuple[list[Any], ...]:
    """``decisions`` one at a time, then in batches; ``before`` each call or batch."""
    single = [(before(), store.run(op))[1] for op in decisions("one")]
    return single, [(before(), store.run_many(batch))[1] for batch in batches("many")]


async def async_run(
    store: RedisStore, before: Callable[[], Any] = _nothing
) -> tuple[list[Any], ...]:
    single = [(before(), await store.arun(op))[1] for op in decisions("one")]
    return single, [(before(), await store.arun_many(batch))[1] for batch in batches("many")]


def sends_directly(store: RedisStore, sync: bool) -> bool:
    scripts = store._clients.sync_scripts() if sync else store._clients.async_scripts()
    send = getattr(scripts["record"], "send", None)
    return getattr(send, "func", None) in (redis_direct._send, redis_direct._asend)


@pytest.mark.parametrize("face", ["sync", "async"])
@pytest.mark.parametrize("kind", ["plain", "subclass", "single connection"])
async def test_a_decoding_client_gets_the_verdicts_of_a_plain_one(
    redis_url: str, clock: Clock, kind: str, face: str
) -> None:
    """Plain: straight to a pooled connection (``redis_direct``), a batch on one
    (``redis_batch``); else ``execute_command``, and redis-py's pipeline for a single
    connection."""
    expected, single, many = reference(redis_url, clock)
    client: Any = (sync_clients if face == "sync" else async_clients)(redis_url)[kind]()
    store = RedisStore(client, prefix=unique_prefix(), clock=clock, open_keys=False)
    try:
        got = sync_run(store) if face == "sync" else await async_run(store)
        assert got == (single, many)
        assert not single[-3].allowed and single[7].tripped is not None  # they did refuse
        assert sends_directly(store, sync=face == "sync") == (kind == "plain")
    finally:
        forget(store, redis_url)
        forget(expected, redis_url)
        await client.aclose() if face == "async" else client.close()


def test_a_watched_decoding_client_gets_the_same_verdicts(redis_url: str, clock: Clock) -> None:
    """A plain client whose ``execute_command`` is wrapped (tracing) sends through it."""
    expected, single, _ = reference(redis_url, clock)
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    calls: list[Any] = []
    execute = client.execute_command

    def traced(*args: Any, **options: Any) -> Any:
        calls.append(args[0])
        return execute(*args, **options)

    client.execute_command = traced  # type: ignore[method-assign]
    store = RedisStore(client, prefix=unique_prefix(), clock=clock, open_keys=False)
    try:
        assert [store.run(op) for op in decisions("one")] == single
        assert calls.count("FCALL") + calls.count("EVALSHA") >= len(single)
    finally:
        forget(store, redis_url)
        forget(expected, redis_url)
        client.close()


@pytest.fixture(params=["functions", "evalsha"])
def flushed_server(
    request: pytest.FixtureRequest, free_port: int, tmp_path: Path
) -> Iterator[tuple[OwnRedis, str]]:
    """A server of the test's own that runs the decisions as functions, or, its FCALL
    disabled, as EVALSHA scripts; and which of the two."""
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server on PATH to start a server of the test's own")
    disabled = ("--rename-command", "FCALL", "") if request.param == "evalsha" else ()
    server = OwnRedis(free_port, tmp_path, *disabled)
    server.start()
    yield server, request.param
    server.stop()


@pytest.mark.parametrize("kind", ["plain", "single connection"])
async def test_after_a_flush_the_reloaded_replies_are_read_undecoded_too(
    flushed_server: tuple[OwnRedis, str], redis_url: str, clock: Clock, kind: str
) -> None:
    """Functions or scripts flushed before each call and batch: every call finds its function
    missing and loads the library (FUNCTION LOAD, then FCALL again), or its script missing
    (NOSCRIPT, then EVAL), each of a batch's in order."""
    server, scripts = flushed_server
    expected, single, many = reference(redis_url, clock)
    sync_client = sync_clients(server.url)[kind]()
    async_client = async_clients(server.url)[kind]()
    admin = redis.Redis.from_url(server.url)
    flush = admin.function_flush if scripts == "functions" else admin.script_flush
    try:
        store = RedisStore(sync_client, prefix="flushed", clock=clock, open_keys=False)
        assert sync_run(store, flush) == (single, many)
        assert store.scripts == scripts
        admin.flushall()
        store = RedisStore(async_client, prefix="flushed", clock=clock, open_keys=False)
        assert await async_run(store, flush) == (single, many)
        assert store.scripts == scripts
    finally:
        forget(expected, redis_url)
        sync_client.close()
        await async_client.aclose()
        admin.close()


async def test_decoding_cluster_clients_get_the_verdicts_of_a_plain_one(
    cluster_url: str, redis_url: str, clock: Clock
) -> None:
    """Their own pipelines for a batch; after FUNCTION FLUSH (every primary's), the library
    loaded again on each key's node."""
    expected, single, many = reference(redis_url, clock)
    sync_client = redis.cluster.RedisCluster.from_url(cluster_url, decode_responses=True)
    async_client = redis.asyncio.cluster.RedisCluster.from_url(cluster_url, decode_responses=True)
    stores: list[RedisStore] = []

    def store_on(client: Any) -> RedisStore:
        stores.append(RedisStore(client, prefix=unique_prefix(), clock=clock, open_keys=False))
        return stores[-1]

    try:
        # Every script cached on the keys' nodes first: a batch whose first script is missing
        # but not its second would run them out of order (the first is sent again, by EVAL).
        sync_run(store_on(sync_client))
        assert sync_run(store_on(sync_client)) == (single, many)
        assert await async_run(store_on(async_client)) == (single, many)

        def flush() -> None:
            sync_client.execute_command("FUNCTION", "FLUSH", target_nodes=sync_client.PRIMARIES)

        assert sync_run(store_on(sync_client), flush) == (single, many)
        flushed = await async_run(store_on(async_client), flush)
        assert flushed == (single, many)
    finally:
        forget(expected, redis_url)
        for store in stores:
            for key in ("one", "many"):
                sync_client.delete(f"{store.prefix}:{{{key}}}")
        sync_client.close()
        await async_client.aclose()


# -- a reply mangled on its way: the store's failure, never a crash in the caller -------------


def cut(reply: Any, kwargs: dict[str, Any]) -> Any:
    """What a proxy that drops the last byte of a script's reply (read undecoded) hands on."""
    return reply[:-1] if kwargs.get("disable_decoding") and isinstance(reply, bytes) else reply


class Mangling(redis.Connection):
    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        return cut(super().read_response(*args, **kwargs), kwargs)


class AsyncMangling(redis.asyncio.Connection):
    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        return cut(await super().read_response(*args, **kwargs), kwargs)


def mangled_fuse(redis_url: str, clock: Clock, events: list[FuseEvent], **options: Any) -> Fuse:
    pool = redis.BlockingConnectionPool.from_url(redis_url, connection_class=Mangling)
    store = RedisStore(redis.Redis.from_pool(pool), prefix=unique_prefix(), clock=clock,
                       open_keys=False)  # fmt: skip
    health = StoreHealth(threshold=3, backoff=5.0, clock=clock)
    return Fuse(store, velocity=POLICY, bucket=BUCKET, on_event=events.append, health=health,
                **options)  # fmt: skip


def test_an_unreadable_reply_fails_the_decision_open_and_is_reported_once(
    redis_url: str, clock: Clock
) -> None:
    events: list[FuseEvent] = []
    fuse = mangled_fuse(redis_url, clock, events)
    store = fuse.store
    assert isinstance(store, RedisStore)
    try:
        with pytest.raises(StoreUnavailable, match="redis record: unreadable reply"):
            store.run(Record("k", 1, POLICY))
        assert sends_directly(store, sync=True)  # the decisions' own path was mangled
        decisions = [fuse.record("k", 1), fuse.admit("k"), fuse.gate("k")]
        assert all(d.allowed and d.degraded for d in decisions)
        assert [e.kind for e in events] == ["store_unavailable"]
    finally:
        forget(store, redis_url)
        store.close()


def test_an_unreadable_reply_fails_the_decision_closed_when_told(
    redis_url: str, clock: Clock
) -> None:
    fuse = mangled_fuse(redis_url, clock, [], fail_closed=True)
    try:
        with pytest.raises(StoreUnavailable):
            fuse.record("k", 1)
        with pytest.raises(StoreUnavailable):
            fuse.record_batch([("k", 1.0), ("k", 2.0)])
    finally:
        forget(fuse.store, redis_url)  # type: ignore[arg-type]
        fuse.store.close()  # type: ignore[union-attr]


async def test_async_an_unreadable_reply_fails_the_decision_open(
    redis_url: str, clock: Clock
) -> None:
    pool = redis.asyncio.BlockingConnectionPool.from_url(redis_url, connection_class=AsyncMangling)
    client = redis.asyncio.Redis.from_pool(pool)
    store = RedisStore(client, prefix=unique_prefix(), clock=clock, open_keys=False)
    fuse = Fuse(store, velocity=POLICY, health=StoreHealth(threshold=3, backoff=5.0, clock=clock))
    try:
        decision = await fuse.arecord("k", 1)
        assert decision.allowed and decision.degraded
        with pytest.raises(StoreUnavailable, match="redis admit: unreadable reply"):
            await store.arun(Admit("k", 1, 1, POLICY, BUCKET))
        with pytest.raises(StoreUnavailable, match="unreadable reply"):
            await store.arun_many([Gate("k"), Record("k", 1, POLICY)])  # a batch too
    finally:
        forget(store, redis_url)
        await client.aclose()
