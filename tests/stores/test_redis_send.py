"""The asyncio decisions' write (``redis_send``) on real redis-servers: no Task per command
while the write cannot wait, and redis-py's own timeouts, errors and retry when it can (a
server that stopped reading, one that resets the connection mid-send). Servers the tests
stop or misconfigure are their own (``own_redis``)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis._parsers.encoders import Encoder

from tests.stores.conftest import OwnRedis, unique_prefix
from tokenfuse import BucketPolicy, Fuse, FuseEvent, VelocityPolicy
from tokenfuse._core.loops import LoopPolicy
from tokenfuse._errors import StoreUnavailable
from tokenfuse._health import StoreHealth
from tokenfuse._middleware import CALL_VELOCITY
from tokenfuse._stores.ops import Admit, CheckLoops, RecordBatch
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_send import pack

pytestmark = pytest.mark.redis

BUCKET = BucketPolicy(rate=1e9, capacity=1e9)
POLICY = VelocityPolicy(cold_start_limit=None)
LOOPS = LoopPolicy(failures=2)
#: A decision's command far larger than the socket buffers of a loopback connection
#: (8 MB of packed amounts): written to a server that does not read, it cannot all leave.
HUGE = 1_000_000


def admit(key: str = "a") -> Admit:
    return Admit(key, cost=1, amount=1, velocity=CALL_VELOCITY, bucket=BUCKET)


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisStore]:
    built = RedisStore.from_url(redis_url, prefix=unique_prefix(), open_keys=False)
    yield built
    await built.aclose()


@pytest.fixture
def admin(own_redis: OwnRedis) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(own_redis.url) as client:
        yield client


class Tasks:
    """Counts the Tasks made on the running loop (its task factory) while installed."""

    def __init__(self) -> None:
        self.made = 0

    def __enter__(self) -> Tasks:
        loop = asyncio.get_running_loop()
        self._before = loop.get_task_factory()

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
            self.made += 1
            return asyncio.Task(coro, loop=loop, **kwargs)

        loop.set_task_factory(factory)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.get_running_loop().set_task_factory(self._before)


def used_connections(pool: Any) -> list[Any]:
    """Every connection the pool of ``RedisStore.from_url`` hands a decision from now on."""
    handed: list[Any] = []
    take = pool.take

    async def recording() -> Any:
        connection = await take()
        handed.append(connection)
        return connection

    pool.take = recording
    return handed


async def test_decisions_make_no_task_per_command(store: RedisStore) -> None:
    fuse = Fuse(store, velocity=POLICY)
    await store.arun(admit())
    await fuse.arecord("agent", 10)  # connected, scripts known: what follows is the hot path
    with Tasks() as tasks:
        for _ in range(20):
            await store.arun(admit())
            await fuse.arecord("agent", 10)
            await store.arun_many(
                [admit(), CheckLoops("a", "0123456789abcdef", LOOPS)]
            )  # one round trip (a batch)
    assert tasks.made == 0
    with Tasks() as tasks:
        await store._clients.async_client().ping()  # redis-py's own write: a Task per command
    assert tasks.made == 1  # (so the count above can see one)


async def test_a_connection_due_its_health_check_is_checked(
    own_redis: OwnRedis, admin: redis.Redis
) -> None:
    store = RedisStore.from_url(own_redis.url, prefix="send", open_keys=False)
    try:
        await store.arun(admit())
        pool: Any = store._clients.async_client().connection_pool
        handed = used_connections(pool)
        pings = admin.info("commandstats").get("cmdstat_ping", {}).get("calls", 0)
        await store.arun(admit())
        handed[0].next_health_check = -1.0  # its interval passed: redis-py sends the check
        await store.arun(admit())
        after = admin.info("commandstats").get("cmdstat_ping", {}).get("calls", 0)
        assert after - pings == 1
    finally:
        await store.aclose()


async def test_a_connection_class_with_its_own_send_is_left_to_it(redis_url: str) -> None:
    sent: list[Any] = []

    class Sending(redis.asyncio.Connection):
        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            sent.append(command)
            await super().send_packed_command(command, check_health)

    client = redis.asyncio.Redis.from_url(redis_url, connection_class=Sending)
    store = RedisStore(client, prefix=unique_prefix())
    try:
        await store.arun(admit())
        sent.clear()
        await store.arun(admit())
        assert len(sent) == 1
    finally:
        await client.aclose()


def stopped(server: OwnRedis) -> Any:
    """SIGSTOP the server (by PID) until the block ends: connections stay open, nothing is
    read or answered."""
    assert server.process is not None
    pid = server.process.pid

    class Stopped:
        def __enter__(self) -> None:
            os.kill(pid, signal.SIGSTOP)

        def __exit__(self, *exc: object) -> None:
            os.kill(pid, signal.SIGCONT)

    return Stopped()


async def test_a_server_that_stops_reading_times_the_write_out(own_redis: OwnRedis) -> None:
    store = RedisStore.from_url(own_redis.url, prefix="send", open_keys=False)
    try:
        await store.arun(admit())
        pool: Any = store._clients.async_client().connection_pool
        handed = used_connections(pool)
        with stopped(own_redis), pytest.raises(StoreUnavailable) as caught:
            await store.arun(RecordBatch("big", (1.0,) * HUGE, POLICY))
        cause = caught.value.__cause__
        assert isinstance(cause, redis.TimeoutError)
        assert str(cause) == "Timeout writing to socket"  # the write's, not the reply's
        assert len(handed) == 1  # a timeout is not retried (redis_budget)
        assert not handed[0].is_connected  # nothing half-written goes back to the pool
    finally:
        await store.aclose()


async def test_a_fuse_counts_a_write_that_timed_out_and_fails_open(own_redis: OwnRedis) -> None:
    events: list[FuseEvent] = []
    store = RedisStore.from_url(own_redis.url, prefix="send", open_keys=False)
    fuse = Fuse(store, velocity=POLICY, on_event=events.append, health=StoreHealth(threshold=3))
    try:
        assert not (await fuse.arecord("agent", 10)).degraded
        settle = RecordBatch("big", (1.0,) * HUGE, POLICY)  # rides with the record
        with stopped(own_redis):
            decision, rest = await fuse.arecord_with("agent", 10, [settle])
        assert decision.allowed and decision.degraded and rest is None
        assert fuse.health.counts.failed == 1
        assert [event.kind for event in events] == ["store_unavailable"]
        assert "Timeout writing to socket" in str(events[0])
    finally:
        await store.aclose()


async def test_a_server_that_resets_mid_send_is_retried_as_before(
    free_port: int, tmp_path: Any
) -> None:
    # A bulk longer than the server takes is a protocol error: the server answers and closes
    # the connection while the client is still writing the rest of it.
    server = OwnRedis(free_port, tmp_path, "--proto-max-bulk-len", "1mb")
    server.start()
    store = RedisStore.from_url(server.url, prefix="send", open_keys=False)
    admin = redis.Redis.from_url(server.url)
    try:
        await store.arun(admit())
        pool: Any = store._clients.async_client().connection_pool
        handed = used_connections(pool)
        connections = admin.info("stats")["total_connections_received"]
        with pytest.raises(StoreUnavailable) as caught:
            await store.arun(RecordBatch("big", (1.0,) * HUGE, POLICY))
        cause = caught.value.__cause__
        assert isinstance(cause, redis.ConnectionError)
        assert "while writing to socket" in str(cause)
        # The connection's retry (one, at once) sent it again on a new connection.
        assert admin.info("stats")["total_connections_received"] - connections == 1
        assert len(handed) == 1 and not handed[0].is_connected
        assert (await store.arun(admit())).allowed
    finally:
        await store.aclose()
        admin.close()
        server.stop()


@pytest.mark.parametrize(
    "words",
    [
        ("FCALL", "admit", 1, "k:{a}", b"\x00\xff" * 20, "", b""),
        ("EVALSHA", "f" * 40, 2, "k:{é}", "k:{b}", "0", -17, b"x" * 100_000),
        ("FCALL", "admit", 1, "k", 1.5),  # a float: redis-py's packing
        ("FCALL", "admit", 1, "k", memoryview(b"abc")),  # a memoryview: redis-py's
        ("FCALL", "admit", 1, "k", True),  # a bool: redis-py refuses it
        ("CONFIG GET", "maxmemory"),  # a name redis-py splits into words
        ("FCALL", "admit", 1, "k:\udcff"),  # no text in UTF-8: refused, or replaced as told
    ],
)
@pytest.mark.parametrize("kind", [redis.asyncio.Connection, redis.Connection])
def test_pack_writes_what_redis_py_packs(words: tuple[Any, ...], kind: Any) -> None:
    for options in ({}, {"encoding": "latin-1"}, {"encoding_errors": "replace"}):
        connection = kind(**options)
        try:
            expected = b"".join(bytes(part) for part in connection.pack_command(*words))
        except (redis.DataError, UnicodeEncodeError) as refused:
            with pytest.raises(type(refused)):
                pack(connection, words)
            continue
        assert b"".join(bytes(part) for part in pack(connection, words)) == expected


async def warm_pool(store: RedisStore) -> Any:
    """The asyncio pool of a store built by ``from_url``, after a first decision (connected,
    the server checked, the scripts known)."""
    await store.arun(admit())
    return store._clients.async_client().connection_pool


def counting_pool(pool: Any) -> dict[str, int]:
    """How often redis-py's own ``get_connection`` and ``release`` of ``pool`` run."""
    calls = {"get_connection": 0, "release": 0}
    for name in calls:
        method = getattr(pool, name)

        async def counted(*args: Any, _method: Any = method, _name: str = name) -> Any:
            calls[_name] += 1
            return await _method(*args)

        setattr(pool, name, counted)
    return calls


async def test_decisions_take_and_give_back_idle_connections_the_lean_way(
    store: RedisStore,
) -> None:
    pool = await warm_pool(store)
    calls = counting_pool(pool)
    for _ in range(5):
        await store.arun(admit())
        await store.arun_many([admit(), CheckLoops("a", "0123456789abcdef", LOOPS)])
    assert calls == {"get_connection": 0, "release": 0}
    assert not pool._in_use_connections and len(pool._available_connections) == 1
    held = await pool.take()  # the only idle connection is out: a new one, redis-py's way
    await store.arun(admit())
    assert calls == {"get_connection": 1, "release": 0}
    await pool.give_back(held)
    assert len(pool._available_connections) == 2 and not pool._in_use_connections


async def test_a_connection_with_a_reply_unread_goes_through_redis_pys_check(
    store: RedisStore,
) -> None:
    pool = await warm_pool(store)
    checked: list[Any] = []
    ensure = pool.ensure_connection

    async def counted(connection: Any) -> None:
        checked.append(connection)
        await ensure(connection)

    pool.ensure_connection = counted
    clean = await pool.take()
    assert checked == []  # connected, nothing unread: handed out as it is
    await clean.send_command("ECHO", "stale")  # its reply is never read
    await pool.give_back(clean)
    while not await clean.can_read():  # the stale reply has arrived (not a timing wait)
        await asyncio.sleep(0)
    again = await pool.take()
    assert again is clean and checked == [clean]  # redis-py's check decides
    await pool.give_back(again)


async def test_a_connection_with_a_new_token_is_given_back_redis_pys_way(
    store: RedisStore,
) -> None:
    pool = await warm_pool(store)
    calls = counting_pool(pool)
    connection = await pool.take()
    connection._re_auth_token = object()  # a streaming credential provider's new token
    released: list[Any] = []

    async def release(connection: Any) -> None:  # redis-py's would AUTH it with the token
        released.append(connection)
        connection._re_auth_token = None
        pool._in_use_connections.remove(connection)
        pool._available_connections.append(connection)

    pool.release = release
    await pool.give_back(connection)
    assert released == [connection]
    assert calls["get_connection"] == 0


async def test_a_take_stopped_during_its_check_gives_the_connection_back(
    store: RedisStore,
) -> None:
    pool = await warm_pool(store)
    idle = pool._available_connections[-1]

    async def cancelled() -> bool:
        raise asyncio.CancelledError  # the decision's task cancelled at this await

    idle.can_read = cancelled
    with pytest.raises(asyncio.CancelledError):
        await pool.take()
    assert not pool._in_use_connections  # not lost to the pool
    del idle.can_read
    assert (await store.arun(admit())).allowed


def test_packed_words_are_kept_for_few_words_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The packed words kept per codec (a word per caller's key) are bounded: the table is
    started again when full, and every command is still packed as redis-py packs it."""
    from tokenfuse._stores import redis_send

    monkeypatch.setattr(redis_send, "_PACKED_MAX", 8)
    connection = redis.Connection()
    for n in range(50):
        words = ("FCALL", "admit", 1, f"k:{{{n}}}", b"x")
        assert b"".join(pack(connection, words)) == b"".join(connection.pack_command(*words))
        assert len(redis_send._PACKED[("utf-8", "strict")]) <= 8


def test_pack_leaves_an_encoder_of_another_class_to_pack_command() -> None:
    class Other(Encoder):
        """An encoder of the caller's, which may encode text its own way."""

    connections: list[Any] = [redis.Connection(), redis.asyncio.Connection()]  # type: ignore[no-untyped-call]
    for connection in connections:
        connection.encoder = Other("utf-8", "strict", False)  # type: ignore[no-untyped-call]
        connection.pack_command = lambda *words: [b"redis-py's"]
        assert pack(connection, ("FCALL", "admit", 1, "k", b"x")) == [b"redis-py's"]
