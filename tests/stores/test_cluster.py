"""Every operation against a real 3-node Redis Cluster (``scripts/redis-cluster.sh``).

Each script touches only the one key of one identity, so a decision is one EVALSHA on the
node that owns its slot, whichever node that is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.crc import key_slot

from tests.conftest import Clock
from tests.stores.conftest import unique_prefix
from tokenfuse import BucketPolicy, Fuse, Identity, VelocityPolicy
from tokenfuse._core.lease import LeasePolicy
from tokenfuse._leases import Leases
from tokenfuse._stores.ops import (
    Admit,
    Configure,
    Gate,
    ReadStatus,
    Record,
    Reset,
)
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_codec import key_of

pytestmark = pytest.mark.cluster

CEILING = VelocityPolicy(limit=1000, cooldown=30)
BUCKET = BucketPolicy(rate=1, capacity=2)
IDENTITIES = [f"default:{n:032x}" for n in range(24)]


@pytest.fixture
def cluster(cluster_url: str) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(cluster_url)
    yield client
    client.close()


@pytest.fixture
def prefix(cluster: RedisCluster) -> Iterator[str]:
    name = unique_prefix()
    yield name
    for identity in IDENTITIES:
        cluster.delete(key_of(name, identity))


def owners(cluster: RedisCluster, prefix: str) -> set[str]:
    """The nodes that own the identities' slots."""
    names = set()
    for identity in IDENTITIES:
        name = key_of(prefix, identity)
        assert key_slot(name.encode()) == key_slot(f"{{{identity}}}".encode())
        names.add(cluster.get_node_from_key(name).name)
    return names


def test_every_operation_on_every_node_sync(
    cluster: RedisCluster, prefix: str, clock: Clock
) -> None:
    assert len(owners(cluster, prefix)) == 3  # the identities land on all three nodes
    store = RedisStore(cluster, prefix=prefix, clock=clock)
    for identity in IDENTITIES:
        assert store.run(Gate(identity)).allowed
        assert store.run(Record(identity, 600, CEILING)).allowed
        assert store.run(Record(identity, 600, CEILING)).tripped
        assert not store.run(Gate(identity)).allowed
        store.run(Configure(identity, limit=5000.0, capacity=3.0))
        admitted = [
            store.run(Admit(identity, cost=1, amount=0, velocity=CEILING, bucket=BUCKET)).allowed
            for _ in range(4)
        ]
        assert admitted == [False] * 4  # the key is still open
        store.run(Reset(identity))
        admitted = [
            store.run(Admit(identity, cost=1, amount=1, velocity=CEILING, bucket=BUCKET)).allowed
            for _ in range(4)
        ]
        assert admitted == [True, True, True, False]  # capacity 3, set live
        status = store.run(ReadStatus(identity, CEILING, BUCKET))
        assert (status.rate, status.limit) == (3.0, 5000.0)
        assert (status.bucket_level, status.bucket_capacity) == (0.0, 3.0)


async def test_every_operation_on_every_node_async(
    cluster_url: str, cluster: RedisCluster, prefix: str, clock: Clock
) -> None:
    client: Any = AsyncRedisCluster.from_url(cluster_url)
    store = RedisStore(client, prefix=prefix, clock=clock)
    try:
        for identity in IDENTITIES:
            assert (await store.arun(Gate(identity))).allowed
            assert (await store.arun(Record(identity, 600, CEILING))).allowed
            assert (await store.arun(Record(identity, 600, CEILING))).tripped
            await store.arun(Configure(identity, capacity=1.0))
            assert not (await store.arun(Admit(identity, cost=1, amount=1, velocity=CEILING,
                                           bucket=BUCKET))).allowed  # fmt: skip
            await store.arun(Reset(identity))
            verdict = await store.arun(Admit(identity, cost=1, amount=1, velocity=CEILING,
                                         bucket=BUCKET))  # fmt: skip
            assert verdict.allowed
            status = await store.arun(ReadStatus(identity, CEILING, BUCKET))
            assert (status.bucket_level, status.bucket_capacity) == (0.0, 1.0)
    finally:
        await client.aclose()


@pytest.fixture
async def url_store(cluster_url: str, prefix: str) -> AsyncIterator[RedisStore]:
    store = RedisStore.from_url(cluster_url.replace("redis://", "redis+cluster://"), prefix=prefix)
    yield store
    await store.aclose()


async def test_from_url_on_the_server_clock_both_faces(
    url_store: RedisStore, cluster: RedisCluster, prefix: str
) -> None:
    identity = IDENTITIES[0]
    assert url_store.run(Record(identity, 600, CEILING)).allowed
    trip = await url_store.arun(Record(identity, 600, CEILING))
    assert trip.tripped and trip.retry_after == 30.0
    assert 29 < url_store.run(Gate(identity)).retry_after <= 30  # the server's clock moved on
    other = RedisStore(cluster, prefix=prefix)  # another process, another client
    await url_store.arun(Configure(IDENTITIES[1], limit=10.0))
    assert other.run(Record(IDENTITIES[1], 11, VelocityPolicy())).reason == "manual_ceiling"


def test_from_url_with_cluster_true(cluster_url: str, prefix: str, clock: Clock) -> None:
    store = RedisStore.from_url(cluster_url, cluster=True, prefix=prefix, clock=clock)
    try:
        for identity in IDENTITIES:
            assert store.run(Record(identity, 1500, CEILING)).tripped
    finally:
        store.close()


def test_scripts_are_reloaded_on_every_node_after_script_flush(
    cluster: RedisCluster, prefix: str, clock: Clock
) -> None:
    store = RedisStore(cluster, prefix=prefix, clock=clock)
    for identity in IDENTITIES:
        store.run(Record(identity, 600, CEILING))
    cluster.script_flush()  # every primary forgets every script
    assert all(store.run(Record(identity, 600, CEILING)).tripped for identity in IDENTITIES)


def test_leases_on_every_node(cluster: RedisCluster, prefix: str, clock: Clock) -> None:
    """Leases of callers on all three nodes: taken with one script each, spent locally,
    given back (each to its node)."""
    store = RedisStore(cluster, prefix=prefix, clock=clock)
    bucket = BucketPolicy(rate=1, capacity=20)
    fuse = Fuse(store, name="in", velocity=CEILING, bucket=bucket, secret="a cluster test secret")
    leases = Leases(fuse, LeasePolicy(size=10), clock=clock, background=False)
    keys = [fuse._key(Identity.of(str(n))) for n in range(len(IDENTITIES))]
    assert len({cluster.get_node_from_key(key_of(prefix, key)).name for key in keys}) == 3
    for n in range(len(IDENTITIES)):
        assert all(leases.admit(str(n), amount=100).allowed for _ in range(3))
    leases.close()  # 8 unspent tokens and 2 calls back from each lease
    assert (leases.counts.returns, leases.counts.returned) == (24, 24 * 8.0)
    for n in range(len(IDENTITIES)):
        status = store.run(ReadStatus(keys[n], CEILING, bucket))
        assert (status.bucket_level, status.rate) == (20 - 3, 300.0)


def test_loop_operations_on_every_node_in_their_identity_slot(
    cluster: RedisCluster, prefix: str, clock: Clock
) -> None:
    """The failure-loop string shares its identity's hash tag: the same slot, so an identity's
    gate and loop check go to one node, and one pipeline (``run_many``) serves both."""
    from tokenfuse._core.loops import LoopPolicy
    from tokenfuse._stores.ops import CheckLoops, ForgetLoops, NoteLoop
    from tokenfuse._stores.redis_codec import loops_key_of

    policy = LoopPolicy(failures=2)
    mark = "0123456789abcdef"
    store = RedisStore(cluster, prefix=prefix, clock=clock, open_keys=False)
    try:
        for identity in IDENTITIES:
            slot = key_slot(loops_key_of(prefix, identity).encode())
            assert slot == key_slot(key_of(prefix, identity).encode())
            gate, check = store.run_many([Gate(identity), CheckLoops(identity, mark, policy)])
            assert gate.allowed and check.allowed
            store.run(NoteLoop(identity, mark, policy, True, 400, "bad"))
            assert store.run(NoteLoop(identity, mark, policy, True, 400, "bad")).tripped
            verdicts = store.run_many([Gate(identity), CheckLoops(identity, mark, policy)])
            assert verdicts[0].allowed and not verdicts[1].allowed
            assert verdicts[1].reason == "failure_loop" and verdicts[1].error == "bad"
            assert store.run(ForgetLoops(identity)) == 1
        assert len(owners(cluster, prefix)) == 3
    finally:
        for identity in IDENTITIES:
            cluster.delete(loops_key_of(prefix, identity))
