"""Decisions as Redis Functions (``redis_scripts.function_library``, ``redis_clients``), on
redis-servers of the tests' own (they flush functions, rename commands, add ACL users): the
library loaded where it is missing, and a server that cannot run functions served by the
EVALSHA scripts instead, with the same decisions, said once and shown on the store."""

from __future__ import annotations

import logging
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoPermissionError

from tests.conftest import Clock
from tests.stores.conftest import OwnRedis, all_at_once, unique_prefix
from tokenfuse import BucketPolicy, MemoryStore, VelocityPolicy
from tokenfuse._stores.ops import Admit, Gate, Op, Record
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_clients import ServerScripts, retried_alone
from tokenfuse._stores.redis_codec import key_of
from tokenfuse._stores.redis_scripts import function_library

pytestmark = pytest.mark.redis

TIGHT = VelocityPolicy(limit=1000, cooldown=30)
BUCKET = BucketPolicy(rate=1.0, capacity=3.0)
LIBRARY = function_library()


def steps() -> list[Op[Any]]:
    """Decisions that fill a window until it trips, then find it open: every verdict kind."""
    return [
        *(Record("k", 300, TIGHT) for _ in range(4)),
        Gate("k"),
        *(Admit("a", cost=1, amount=10, velocity=TIGHT, bucket=BUCKET) for _ in range(5)),
        Gate("a"),
    ]


def store_on(server: OwnRedis, clock: Clock, **options: Any) -> RedisStore:
    return RedisStore.from_url(server.url, prefix="fn", open_keys=False, clock=clock, **options)


def calls(admin: redis.Redis) -> dict[str, int]:
    """The server's count of each command run (INFO commandstats)."""
    stats = admin.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(stat["calls"]) for name, stat in stats.items()}


def libraries(admin: redis.Redis) -> list[str]:
    """The names of the server's function libraries (FUNCTION LIST)."""
    return sorted(
        dict(zip(entry[::2], entry[1::2], strict=True))[b"library_name"].decode()
        for entry in admin.function_list()
    )


@pytest.fixture
def admin(own_redis: OwnRedis) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(own_redis.url) as client:
        yield client


def run_all(store: RedisStore, ops: list[Op[Any]]) -> list[Any]:
    """One at a time, then the last three in one pipeline (``run_many``)."""
    return [store.run(op) for op in ops[:-3]] + store.run_many(ops[-3:])


async def arun_all(store: RedisStore, ops: list[Op[Any]]) -> list[Any]:
    return [await store.arun(op) for op in ops[:-3]] + await store.arun_many(ops[-3:])


# -- a server with functions ------------------------------------------------------------------


async def test_a_fresh_server_gets_the_library_and_every_decision_is_an_fcall(
    own_redis: OwnRedis, admin: redis.Redis
) -> None:
    assert libraries(admin) == []
    store = store_on(own_redis, Clock())
    try:
        results = run_all(store, steps()) + await arun_all(store, steps()[:5])
    finally:
        await store.aclose()
    assert results[3].tripped and not results[4].allowed  # the window tripped, then gated
    assert libraries(admin) == [LIBRARY.name]
    counted = calls(admin)
    assert counted["fcall"] >= len(steps()) + 5
    assert "evalsha" not in counted and "eval" not in counted
    assert counted["function|load"] == 1  # the asyncio client found it loaded
    assert store.scripts == "functions" and store.scripts_reason == ""
    assert "scripts=functions" in repr(store)


async def test_a_function_flush_between_calls_reloads_the_library(
    own_redis: OwnRedis, admin: redis.Redis
) -> None:
    clock, twin_clock = Clock(), Clock()
    store = store_on(own_redis, clock)
    unflushed = RedisStore.from_url(own_redis.url, prefix="twin", open_keys=False, clock=twin_clock)
    try:
        expected = run_all(unflushed, steps())
        got = []
        for op in steps()[:-3]:
            admin.function_flush()
            got.append(store.run(op))
        admin.function_flush()
        got += store.run_many(steps()[-3:])  # every call of the pipeline missing its function
        admin.function_flush()
        assert (await store.arun(Gate("k"))) == got[4]
    finally:
        await store.aclose()
        await unflushed.aclose()
    assert got == expected
    assert store.scripts == "functions"
    assert calls(admin)["function|load"] >= len(steps())
    assert "evalsha" not in calls(admin)


def test_stores_racing_the_first_load_all_decide(own_redis: OwnRedis, admin: redis.Redis) -> None:
    stores = [store_on(own_redis, Clock()) for _ in range(8)]
    mine = iter(stores)
    try:
        verdicts = all_at_once(lambda: next(mine).run(Record("k", 10, TIGHT)), len(stores))
        assert all(verdict.allowed for verdict in verdicts)
        assert sorted(verdict.rate for verdict in verdicts) == [10.0 * n for n in range(1, 9)]
        assert all(store.scripts == "functions" for store in stores)
    finally:
        for store in stores:
            store.close()
    assert libraries(admin) == [LIBRARY.name]


def test_a_library_another_process_loaded_first_is_as_good(
    own_redis: OwnRedis, admin: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race made certain: the other process loads the library between this store's
    'Function not found' and its own FUNCTION LOAD, which answers 'already exists'."""
    original = redis.Redis.execute_command

    def load_first(self: redis.Redis, *args: Any, **options: Any) -> Any:
        if args[:2] == ("FUNCTION", "LOAD"):
            admin.function_load(LIBRARY.code)
        return original(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", load_first)
    store = store_on(own_redis, Clock())
    try:
        assert store.run(Record("k", 10, TIGHT)).rate == 10.0
        assert store.scripts == "functions"
    finally:
        store.close()
    assert calls(admin)["fcall"] == 2  # not found, then the decision
    assert "evalsha" not in calls(admin)


def test_the_library_binds_struct_at_its_first_call(
    own_redis: OwnRedis, admin: redis.Redis
) -> None:
    """Redis hides struct while a library loads: the library starts on its plain-Lua doubles
    and must use struct.pack and struct.unpack from its first call on (the bytes are the same,
    only the speed differs: asked of the library itself)."""
    probe = LIBRARY.code.replace(LIBRARY.name, "probe") + (
        "\nredis.register_function('probe_bound', function() return "
        "{tostring(bound), tostring(pack == struct.pack), "
        "tostring(unpack_doubles == struct.unpack)} end)"
    )
    admin.function_load(probe)
    assert admin.fcall("probe_bound", 0) == [b"false", b"false", b"false"]
    gate = LIBRARY.functions["gate"].replace(LIBRARY.name, "probe")
    assert admin.fcall(gate, 1, "fn:{k}", "") == struct.pack("<d", 1.0)  # allowed
    assert admin.fcall("probe_bound", 0) == [b"true", b"true", b"true"]


def test_policies_past_the_memo_decide_as_the_core(own_redis: OwnRedis) -> None:
    """The library keeps the policies it decoded (64 of each kind, then it starts afresh):
    one key per policy, 70 policies twice round, each verdict the core's (MemoryStore's)."""
    clock = Clock()
    store, reference = store_on(own_redis, clock), MemoryStore(clock=clock)
    policies = [VelocityPolicy(limit=1000 + n, cooldown=30) for n in range(70)]
    buckets = [BucketPolicy(rate=1.0, capacity=3.0 + n) for n in range(70)]
    try:
        for _ in range(2):  # the second round trips every key, by its own limit
            tripped = 0
            for n, (velocity, bucket) in enumerate(zip(policies, buckets, strict=True)):
                record = Record(f"r{n}", 600 + n, velocity)
                verdict = store.run(record)
                assert verdict == reference.run(record)
                tripped += verdict.tripped
                admit = Admit(f"a{n}", 1.0, 1.0, velocity, bucket)
                assert store.run(admit) == reference.run(admit)
            clock.advance(1.0)
        assert tripped == len(policies)
    finally:
        store.close()


def test_the_library_names_carry_its_hash() -> None:
    assert LIBRARY.name.startswith("tokenfuse_") and len(LIBRARY.name) == len("tokenfuse_") + 12
    assert all(name.startswith(f"{LIBRARY.name}_") for name in LIBRARY.functions.values())
    assert LIBRARY.code.startswith(f"#!lua name={LIBRARY.name}\n")


# -- a server that cannot run functions -------------------------------------------------------


def another_server(tmp_path: Path, *settings: str) -> OwnRedis:
    """A second redis-server of the test's own (``own_redis`` took ``free_port``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    folder = tmp_path / str(port)
    folder.mkdir()
    server = OwnRedis(port, folder, *settings)
    server.start()
    return server


@pytest.fixture
def no_fcall(tmp_path: Path) -> Iterator[OwnRedis]:
    """A redis-server whose FCALL is disabled (renamed to nothing)."""
    server = another_server(tmp_path, "--rename-command", "FCALL", "")
    yield server
    server.stop()


async def expect_fallback(
    server: OwnRedis,
    reference: OwnRedis,
    caplog: pytest.LogCaptureFixture,
    reason: str,
    **options: Any,
) -> RedisStore:
    """The steps on ``server`` give the verdicts and state that a store with functions gives
    on ``reference``; the store says once that it runs EVALSHA scripts, and why."""
    expected_store = store_on(reference, Clock())
    store = store_on(server, Clock(), **options)
    try:
        with caplog.at_level(logging.WARNING, logger="tokenfuse"):
            got = run_all(store, steps())
            admin = redis.Redis.from_url(server.url, **options)
            admin.script_flush()  # the scripts' own recovery still works: EVAL
            got_async = await arun_all(store, steps()[:5])
            admin.close()
        expected = run_all(expected_store, steps())
        expected_async = await arun_all(expected_store, steps()[:5])
        assert expected_store.scripts == "functions"
    finally:
        await store.aclose()
        await expected_store.aclose()
    assert got == expected and got_async == expected_async
    said = [r.getMessage() for r in caplog.records if "runs no Redis Functions" in r.getMessage()]
    assert len(said) == 2  # once for the sync client, once for the asyncio one
    assert all(reason in line for line in said)
    assert store.scripts == "evalsha" and reason in store.scripts_reason
    assert "scripts=evalsha" in repr(store)
    return store


async def test_a_server_with_fcall_renamed_runs_the_scripts(
    no_fcall: OwnRedis, own_redis: OwnRedis, caplog: pytest.LogCaptureFixture
) -> None:
    await expect_fallback(no_fcall, own_redis, caplog, "unknown command")
    counted = calls(redis.Redis.from_url(no_fcall.url))
    assert counted["evalsha"] >= len(steps()) and counted["eval"] >= 1
    assert "function|load" not in counted


@pytest.mark.parametrize(
    ("denied", "reason"),
    [("-function", "'function|load' command"), ("-fcall", "'fcall' command")],
)
async def test_a_user_denied_functions_runs_the_scripts(
    own_redis: OwnRedis,
    admin: redis.Redis,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    denied: str,
    reason: str,
) -> None:
    admin.execute_command("ACL", "SETUSER", "agent", "on", ">secret", "~*", "&*", "+@all", denied)
    reference = another_server(tmp_path)
    try:
        await expect_fallback(
            own_redis, reference, caplog, reason, username="agent", password="secret"
        )
    finally:
        reference.stop()
    assert "NoPermissionError" in caplog.text


def test_a_refused_load_moves_the_client_to_the_scripts(caplog: pytest.LogCaptureFixture) -> None:
    server = ServerScripts("sync")
    assert server.loaded(redis.ResponseError("Library 'x' already exists"))
    assert server.functions
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        assert not server.loaded(redis.ResponseError("Error compiling function"))
        assert not server.loaded(redis.ResponseError("Error compiling function"))
    assert not server.functions and "Error compiling function" in server.reason
    assert server.heads["record"][0] == "EVALSHA"
    assert caplog.text.count("runs no Redis Functions") == 1


# -- a cluster: each primary loads the library when it first needs it ---------------------------


@pytest.fixture
def cluster(cluster_url: str) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(cluster_url)
    for node, loaded in has_library(client).items():  # a first use on every primary
        if loaded:
            delete_library(client, node)
    yield client
    client.close()


def has_library(cluster: RedisCluster) -> dict[str, bool]:
    """Whether each primary holds the library."""
    words = ("FUNCTION", "LIST", "LIBRARYNAME", LIBRARY.name)
    listed = cluster.execute_command(*words, target_nodes="primaries")
    return {node: bool(reply) for node, reply in listed.items()}


def delete_library(cluster: RedisCluster, node: str) -> None:
    cluster.execute_command(
        "FUNCTION", "DELETE", LIBRARY.name, target_nodes=cluster.get_node(node_name=node)
    )


def identities_on(cluster: RedisCluster, prefix: str, node: str, count: int) -> list[str]:
    """``count`` identities whose keys ``node`` owns."""
    found = (f"id-{n}" for n in range(100_000))
    mine = (i for i in found if cluster.get_node_from_key(key_of(prefix, i)).name == node)
    return [next(mine) for _ in range(count)]


def cluster_calls(cluster: RedisCluster) -> dict[str, dict[str, int]]:
    stats = cluster.info("commandstats", target_nodes="primaries")
    return {
        node: {name.removeprefix("cmdstat_"): int(stat["calls"]) for name, stat in each.items()}
        for node, each in stats.items()
    }


@pytest.mark.cluster
async def test_each_primary_loads_the_library_when_its_keys_first_come(
    cluster: RedisCluster, cluster_url: str
) -> None:
    prefix = unique_prefix()
    first, *others = sorted(node.name for node in cluster.get_primaries())
    assert not any(has_library(cluster).values())
    before = cluster_calls(cluster)
    store = RedisStore(cluster, prefix=prefix, clock=Clock(), open_keys=False)
    try:
        for identity in identities_on(cluster, prefix, first, 3):
            assert store.run(Record(identity, 10, TIGHT)).rate == 10.0
        assert has_library(cluster) == {first: True, **dict.fromkeys(others, False)}
        astore = RedisStore.from_url(
            cluster_url, cluster=True, prefix=prefix, clock=Clock(), open_keys=False
        )
        try:
            for node in others:  # the asyncio client, and a pipeline of the sync one
                (identity,) = identities_on(cluster, prefix, node, 1)
                assert (await astore.arun(Record(identity, 10, TIGHT))).rate == 10.0
                ops = [Record(identity, 10, TIGHT), Gate(identity), Record(identity, 5, TIGHT)]
                assert [v.rate for v in store.run_many(ops)] == [20.0, 0.0, 25.0]
            assert astore.scripts == "functions"
        finally:
            await astore.aclose()
    finally:
        store.close()
    assert all(has_library(cluster).values())
    assert store.scripts == "functions"
    after = cluster_calls(cluster)
    for node, counted in after.items():
        assert counted["fcall"] > before[node].get("fcall", 0)
        assert counted.get("evalsha", 0) == before[node].get("evalsha", 0)
        # redis-py would ask a node for each FCALL's keys (redis_clients.learn_fcall_keys)
        assert counted.get("command|getkeys", 0) == before[node].get("command|getkeys", 0)


@pytest.mark.cluster
async def test_a_function_flush_on_one_primary_is_healed(
    cluster: RedisCluster, cluster_url: str
) -> None:
    prefix = unique_prefix()
    flushed = sorted(node.name for node in cluster.get_primaries())[1]
    identities = identities_on(cluster, prefix, flushed, 2)
    store = RedisStore(cluster, prefix=prefix, clock=Clock(), open_keys=False)
    astore = RedisStore.from_url(
        cluster_url, cluster=True, prefix=prefix, clock=Clock(), open_keys=False
    )
    try:
        assert store.run(Record(identities[0], 600, TIGHT)).allowed
        delete_library(cluster, flushed)
        assert store.run(Record(identities[0], 600, TIGHT)).tripped
        delete_library(cluster, flushed)
        assert not (await astore.arun(Gate(identities[0]))).allowed
        delete_library(cluster, flushed)
        verdicts = store.run_many([Record(identities[1], 10, TIGHT), Gate(identities[0])])
        assert verdicts[0].rate == 10.0 and not verdicts[1].allowed
    finally:
        store.close()
        await astore.aclose()
    assert has_library(cluster)[flushed]
    assert store.scripts == astore.scripts == "functions"


def test_only_a_refusal_of_functions_moves_a_client_to_the_scripts() -> None:
    """A missing key permission or a script's own error says nothing about functions."""
    assert retried_alone(redis.ResponseError("Function not found"))
    assert retried_alone(redis.ResponseError("unknown command 'FCALL', with args beginning"))
    assert retried_alone(
        NoPermissionError("this user has no permissions to run the 'fcall' command")
    )
    assert not retried_alone(
        NoPermissionError("this user has no permissions to access one of the keys used")
    )
    assert not retried_alone(redis.ResponseError("user_function:3: tokenfuse: k holds no state"))


async def test_a_first_pipeline_on_a_server_without_functions_still_decides(
    no_fcall: OwnRedis,
) -> None:
    """Every FCALL of the batch refused: each operation made alone, on the EVALSHA path."""
    store = store_on(no_fcall, Clock())
    ops: list[Op[Any]] = [Record("k", 300, TIGHT), Record("k", 300, TIGHT), Gate("k")]
    try:
        verdicts = store.run_many(ops)
        averdicts = await store.arun_many(ops)
    finally:
        await store.aclose()
    assert [v.rate for v in verdicts[:2]] == [300.0, 600.0] and verdicts[2].allowed
    assert [v.rate for v in averdicts[:2]] == [900.0, 1200.0] and averdicts[1].tripped
    assert not averdicts[2].allowed
    assert store.scripts == "evalsha"
