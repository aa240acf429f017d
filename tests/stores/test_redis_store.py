"""RedisStore itself: construction, its two faces, the error boundary, the wire formats."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from importlib import resources
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio

from tests.conftest import Clock
from tests.stores.conftest import delete_prefix, unique_prefix
from tokenfuse import BucketPolicy, ConfigurationError, StoreUnavailable, VelocityPolicy
from tokenfuse._stores.base import AsyncStore, Store, SyncStore
from tokenfuse._stores.ops import Admit, Gate, ReadStatus, Record
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_budget import COMMAND_TIMEOUT, CONNECT_TIMEOUT
from tokenfuse._stores.redis_clients import _cluster_url
from tokenfuse._stores.redis_scripts import script_sources, shake

POLICY = VelocityPolicy(limit=1000)


def test_it_is_a_store_with_both_faces() -> None:
    store = RedisStore.from_url("redis://127.0.0.1:1/0")
    assert isinstance(store, Store)
    assert isinstance(store, SyncStore) and isinstance(store, AsyncStore)
    assert repr(store) == "RedisStore(prefix='tokenfuse', sync+async, scripts=functions)"  # no URL


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"prefix": ""}, "prefix", id="empty-prefix"),
        pytest.param({"prefix": "a{b}"}, "brace", id="hash-tag-in-prefix"),
        pytest.param({"ttl": 0}, "ttl", id="zero-ttl"),
        pytest.param({"ttl": math.inf}, "ttl", id="endless-ttl"),
    ],
)
def test_bad_options_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RedisStore(fakeredis.FakeRedis(), **kwargs)  # type: ignore[arg-type]


def test_a_client_that_is_not_redis_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"redis\.Redis"):
        RedisStore(object())  # type: ignore[arg-type]


def test_an_empty_key_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="empty"):
        RedisStore(fakeredis.FakeRedis()).run(Gate(""))


async def test_each_client_serves_its_own_face_only() -> None:
    sync_store = RedisStore(fakeredis.FakeRedis())
    with pytest.raises(ConfigurationError, match="sync client"):
        await sync_store.arun(Gate("k"))
    async_store = RedisStore(fakeredis.FakeAsyncRedis())
    with pytest.raises(ConfigurationError, match="asyncio client"):
        async_store.run(Gate("k"))
    assert (await async_store.arun(Gate("k"))).allowed


def test_an_unreachable_server_is_store_unavailable(free_port: int) -> None:
    store = RedisStore.from_url(f"redis://127.0.0.1:{free_port}/0")
    with pytest.raises(StoreUnavailable, match="redis record failed") as caught:
        store.run(Record("k", 1, POLICY))
    assert isinstance(caught.value.__cause__, redis.ConnectionError)
    store.close()


async def test_an_unreachable_server_is_store_unavailable_async(free_port: int) -> None:
    store = RedisStore.from_url(f"redis://127.0.0.1:{free_port}/0")
    with pytest.raises(StoreUnavailable, match="redis admit failed") as caught:
        await store.arun(Admit("k", cost=1, amount=1, velocity=POLICY, bucket=None))
    assert isinstance(caught.value.__cause__, redis.ConnectionError)
    await store.aclose()


@pytest.mark.parametrize(
    "foreign",
    [lambda c: c.hset("p:{k}", "f", "not a string"), lambda c: c.set("p:{k}", "not our state")],
    ids=["wrong-type", "wrong-length"],
)
def test_a_server_error_is_store_unavailable_too(foreign: Callable[[Any], object]) -> None:
    client = fakeredis.FakeRedis()
    store = RedisStore(client, prefix="p")
    foreign(client)
    with pytest.raises(StoreUnavailable) as caught:
        store.run(Record("k", 1, POLICY))
    assert isinstance(caught.value.__cause__, redis.ResponseError)


def test_from_url_defaults_are_short_and_overridable() -> None:
    assert (COMMAND_TIMEOUT, CONNECT_TIMEOUT) == (0.25, 1.0)
    store = RedisStore.from_url("redis://127.0.0.1:1/0", socket_timeout=2.0)
    client = store._clients._make_sync() if store._clients._make_sync else None
    assert isinstance(client, redis.Redis)
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (2.0, 1.0)
    assert kwargs["health_check_interval"] == 30
    assert kwargs["retry"].get_retries() == 1
    client.close()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis+cluster://h:7000/0", ("redis://h:7000/0", True)),
        ("rediss+cluster://u:p@h:7000", ("rediss://u:p@h:7000", True)),
        ("redis://h:6379/2", ("redis://h:6379/2", False)),
        ("unix:///tmp/redis.sock", ("unix:///tmp/redis.sock", False)),
    ],
)
def test_cluster_urls(url: str, expected: tuple[str, bool]) -> None:
    assert _cluster_url(url) == expected


@pytest.mark.redis
async def test_from_url_serves_both_faces_on_one_state(redis_url: str, clock: Clock) -> None:
    prefix = unique_prefix()
    store = RedisStore.from_url(redis_url, prefix=prefix, clock=clock)
    try:
        assert store.run(Record("k", 600, POLICY)).allowed
        assert (await store.arun(Record("k", 600, POLICY))).tripped
        assert not store.run(Gate("k")).allowed
        assert not (await store.arun(Gate("k"))).allowed
    finally:
        delete_prefix(redis.Redis.from_url(redis_url), prefix)
        store.close()
        await store.aclose()


@pytest.mark.redis
def test_a_client_that_decodes_responses_works(redis_url: str, clock: Clock) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    store = RedisStore(client, prefix=unique_prefix(), clock=clock)
    bucket = BucketPolicy(rate=1, capacity=1)
    try:
        assert store.run(Record("k", 600, POLICY)).allowed
        assert store.run(Record("k", 600, POLICY)).tripped
        assert store.run(Gate("k")).retry_after == 60.0
        assert not store.run(Admit("k", cost=1, amount=1, velocity=POLICY, bucket=bucket)).allowed
        status = store.run(ReadStatus("k", POLICY, bucket))
        assert status.rate == 1200.0
    finally:
        delete_prefix(redis.Redis.from_url(redis_url), store.prefix)
        client.close()


# -- the stored doubles: struct on Redis, plain Lua on fakeredis (which has no struct) ----------

EDGES = [0.0, -0.0, 1.0, -1.0, 0.1, 1 / 3, 1e-300, 5e-324, 2.2250738585072014e-308,
         2.225073858507201e-308, 1.7976931348623157e308, 2.0**53 + 2, 1767225600.123456, -1e9,
         math.inf, -math.inf]  # fmt: skip
ROUND_TRIP = """
local n = #ARGV
local format = '<' .. string.rep('d', n)
local numbers = {}
for i = 1, n do numbers[i] = tonumber(ARGV[i]) end
numbers[#numbers + 1] = 1 / 0
numbers[#numbers + 1] = -1 / 0
local blob = pack('<' .. string.rep('d', n + 2), unpack(numbers))
local back = {unpack_doubles('<' .. string.rep('d', n + 2), blob)}
local shifted = {unpack_doubles('<' .. string.rep('d', n + 2), 'abc' .. blob, 4)} -- at byte 4
local same = 1
for i = 1, n + 2 do
  if back[i] ~= numbers[i] or 1 / back[i] ~= 1 / numbers[i] then same = 0 end
  if shifted[i] ~= numbers[i] or 1 / shifted[i] ~= 1 / numbers[i] then same = 0 end
end
return {blob, same}
"""


@pytest.mark.parametrize("server", [pytest.param("redis", marks=pytest.mark.redis), "fakeredis"])
def test_doubles_are_stored_bit_for_bit(server: str, request: pytest.FixtureRequest) -> None:
    if server == "redis":
        client = redis.Redis.from_url(request.getfixturevalue("redis_url"))
    else:
        client = fakeredis.FakeRedis()
    lib = (resources.files("tokenfuse._stores") / "lua" / "_lib.lua").read_text()
    finite = [x for x in EDGES if math.isfinite(x)]
    blob, same = client.eval(shake(lib, ROUND_TRIP), 0, *map(repr, finite))
    assert blob == struct.pack(f"<{len(finite) + 2}d", *finite, math.inf, -math.inf)
    assert same == 1


def test_each_script_defines_only_what_it_uses() -> None:
    sources = script_sources()
    assert "local function consume" not in sources["gate"]
    assert "local function record" not in sources["gate"]
    assert "local function gate" in sources["admit"]
    assert "local function consume" in sources["admit"]
    for name, source in sources.items():
        assert source.count("local function clock(") <= 1, name


def test_a_fuse_over_a_one_face_store_refuses_the_other_face_clearly() -> None:
    import redis.asyncio

    from tokenfuse import AsyncFuseTransport, Fuse, FuseTransport, TokenFuseWSGI

    async_only = Fuse(RedisStore(redis.asyncio.Redis()))
    sync_only = Fuse(RedisStore(redis.Redis()))
    assert async_only.has_async
    assert not async_only.has_sync
    assert sync_only.has_sync
    assert not sync_only.has_async
    with pytest.raises(ConfigurationError, match="async-only"):
        FuseTransport(fuse=async_only)
    with pytest.raises(ConfigurationError, match="sync-only"):
        AsyncFuseTransport(fuse=sync_only)
    with pytest.raises(ConfigurationError, match="async-only"):
        TokenFuseWSGI(lambda environ, start: [], fuse=async_only)
    with pytest.raises(ConfigurationError, match="async-only"):
        async_only.record("k", 1)  # a clear error, not a silent fail-open


def test_both_stores_run_every_operation() -> None:
    """An operation is one class in ``ops`` and one entry per store: a Lua script, except for
    ``ListKeys``, which walks many keys (``redis_listing``); ``ReadState`` shares ``status``'s
    script with ``ReadStatus``."""
    from tokenfuse._stores import ops
    from tokenfuse._stores.memory import _APPLY
    from tokenfuse._stores.redis_codec import CODECS

    exported = (getattr(ops, name) for name in ops.__all__)
    operations = {kind for kind in exported if isinstance(kind, type) and issubclass(kind, ops.Op)}
    operations.discard(ops.Op)
    assert len(operations) == 20
    assert set(_APPLY) == operations
    assert set(CODECS) == operations - {ops.ListKeys}
    assert sorted(script_sources()) == sorted({op.name for op in CODECS})
