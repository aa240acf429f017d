"""The open-key view: gates answered without a round trip, learned from every process's trips
and resets, and the round trip again whenever the view cannot be trusted.

Two stores on one server stand for two processes (each has its own view, connection and
thread); ``benchmarks/bench_open_keys.py`` does it with two real processes and times it.
Waits are bounded and end on the view's own change notifications, not on sleeps.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import uuid
from collections.abc import Iterator

import fakeredis
import pytest
import redis

from tests.conftest import Clock
from tests.stores.conftest import HeldAnnouncements, OwnRedis
from tokenfuse import CeilingExceeded, Fuse, StoreUnavailable, VelocityPolicy
from tokenfuse._stores import open_keys
from tokenfuse._stores.open_keys import STALE_AFTER, OpenKeys, _Unheard
from tokenfuse._stores.ops import Admit, Forgive, Gate, Op, Record, RecordBatch, Reset
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_codec import key_of

pytestmark = pytest.mark.redis

POLICY = VelocityPolicy(limit=100, cooldown=60)
WAIT = 5.0  # seconds a change may take to arrive on a busy machine (it takes milliseconds)


def view_of(store: RedisStore) -> OpenKeys:
    assert store.open_keys is not None
    return store.open_keys


@pytest.fixture
def two_stores(redis_url: str, redis_prefix: str) -> Iterator[tuple[RedisStore, RedisStore]]:
    stores = (
        RedisStore.from_url(redis_url, prefix=redis_prefix),
        RedisStore.from_url(redis_url, prefix=redis_prefix),
    )
    yield stores
    for store in stores:
        store.close()


def test_a_trip_in_one_process_is_refused_in_another_without_a_round_trip(
    two_stores: tuple[RedisStore, RedisStore],
) -> None:
    a, b = two_stores
    view = view_of(b)
    assert view.wait_synced(WAIT)
    fuse_a, fuse_b = Fuse(a, velocity=POLICY), Fuse(b, velocity=POLICY)
    assert fuse_b.gate("agent").allowed
    local = view.counts.local
    assert local >= 1

    assert fuse_a.record("agent", 500).tripped
    key = key_of(b.prefix, fuse_b._key(fuse_b_identity("agent")))
    assert view.wait_until(lambda v: key in v._open, WAIT)
    refused = fuse_b.gate("agent")
    assert not refused.allowed
    assert isinstance(refused.error, CeilingExceeded)
    assert refused.rate == 500.0 and refused.limit == 100.0
    assert 0 < refused.error.retry_after <= 60
    round_trips = view.counts.round_trips
    assert view.counts.local == local  # a refusal is not counted as an allowed local answer
    assert fuse_b.gate("agent").error is not None
    assert view.counts.round_trips == round_trips  # refused from the view: no round trip

    fuse_a.reset("agent")
    assert view.wait_until(lambda v: key not in v._open, WAIT)
    assert fuse_b.gate("agent").allowed
    assert view.counts.round_trips == round_trips


def fuse_b_identity(who: str) -> object:
    from tokenfuse._identity import Identity

    return Identity.of(who)


def test_a_view_that_syncs_late_finds_the_keys_already_open(
    redis_url: str, redis_prefix: str
) -> None:
    first = RedisStore.from_url(redis_url, prefix=redis_prefix)
    fuse = Fuse(first, velocity=POLICY)
    assert fuse.record("early", 500).tripped  # before any other view exists
    late = RedisStore.from_url(redis_url, prefix=redis_prefix)
    try:
        assert view_of(late).wait_synced(WAIT)
        refused = Fuse(late, velocity=POLICY).gate("early")
        assert not refused.allowed and refused.rate == 500.0
        assert view_of(late).counts.round_trips == 0  # the marker said so, not the store
    finally:
        first.close()
        late.close()


def test_this_process_refuses_its_own_trip_at_once(redis_url: str, redis_prefix: str) -> None:
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    try:
        assert view_of(store).wait_synced(WAIT)
        key = f"{redis_prefix}-own"
        assert store.run(Record(key, 500.0, POLICY)).tripped
        # No waiting for the announcement: the very next gate is refused (by the store, or by
        # the view if the message was faster).
        assert not store.run(Gate(key)).allowed
    finally:
        store.close()


# Each rule of detection v2 that a new key can trip, and each operation that records.
COLD = VelocityPolicy(limit=None, cold_start_limit=1_000, cold_start_sustained=600)
TRIPS: list[tuple[str, VelocityPolicy, Op[object]]] = [
    ("manual_ceiling", POLICY, Record("t", 500.0, POLICY)),
    ("cold_start_ceiling", COLD, Record("t", 7_000.0, COLD)),  # over 10 min of budget
    ("cold_start_ceiling", COLD, RecordBatch("t", (600.0, 600.0, 600.0), COLD)),
    ("manual_ceiling", POLICY, Admit("t", cost=0.0, amount=500.0, velocity=POLICY, bucket=None)),
]


@pytest.fixture(params=["redis", "fakeredis"])
def view_and_script(
    request: pytest.FixtureRequest, redis_prefix: str, clock: Clock
) -> Iterator[tuple[RedisStore, RedisStore]]:
    """Two stores on one server and clock, one with a view and one without: on Redis, and on
    fakeredis, whose Lua has no ``struct`` (the scripts pack and unpack in plain Lua)."""
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
        stores = (
            RedisStore.from_url(url, prefix=redis_prefix, clock=clock),
            RedisStore.from_url(url, prefix=redis_prefix, clock=clock, open_keys=False),
        )
    else:
        server = fakeredis.FakeServer()
        stores = (
            RedisStore(fakeredis.FakeRedis(server=server), prefix=redis_prefix, clock=clock),
            RedisStore(
                fakeredis.FakeRedis(server=server), prefix=redis_prefix, clock=clock,
                open_keys=False,
            ),
        )  # fmt: skip
    yield stores
    for store in stores:
        store.close()


@pytest.mark.parametrize(("reason", "policy", "op"), TRIPS)
def test_the_view_answers_exactly_as_the_script_does(
    view_and_script: tuple[RedisStore, RedisStore],
    clock: Clock,
    reason: str,
    policy: VelocityPolicy,
    op: Op[object],
) -> None:
    """With an injected clock the view's refusal is the script's, double for double: its
    reason, rate, limit, baseline, multiple (None included) and window travel as text."""
    with_view, without = view_and_script
    view = view_of(with_view)
    assert view.wait_synced(WAIT)
    verdict = without.run(op)
    assert getattr(verdict, "velocity", verdict).tripped
    full = key_of(with_view.prefix, "t")
    assert view.wait_until(lambda v: v._open.get(full, (0, None))[1] is not None, WAIT)
    cooldown = policy.cooldown
    for step in (0.0, 0.001, cooldown / 8, cooldown * 0.87):
        clock.advance(step)
        from_view = with_view.run(Gate("t"))
        assert from_view == without.run(Gate("t"))
        assert not from_view.allowed and from_view.reason == reason
    clock.advance(cooldown)  # past the cooldown: open no more, in both
    assert with_view.run(Gate("t")).allowed and without.run(Gate("t")).allowed


def test_no_view_before_it_has_synced(redis_url: str, redis_prefix: str) -> None:
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    try:
        view = view_of(store)
        assert not view.trusted
        assert store.run(Gate("k")).allowed  # a round trip, and it starts the subscriber
        assert view.counts.round_trips == 1
        assert view.counts.local == 0
    finally:
        store.close()


def test_a_killed_subscription_falls_back_to_round_trips_and_comes_back(
    own_redis: OwnRedis, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore.from_url(own_redis.url, prefix="tf-view")
    view = view_of(store)
    try:
        assert view.wait_synced(WAIT)
        # A reset whose announcement dies with the subscription (learned here, never sent),
        # on a clock that stands still: only the sync, whose markers are the truth, forgets it.
        view._closing._now = lambda: 0.0
        view.learn(Reset("gone"), key_of("tf-view", "gone"), None)
        assert view._closing.hides(key_of("tf-view", "gone"))
        with redis.Redis.from_url(own_redis.url) as admin, caplog.at_level(logging.WARNING):
            admin.client_kill_filter(_type="pubsub")
            assert view.wait_until(lambda v: v.counts.lost >= 1, WAIT)
        assert "lost the open-key subscription" in caplog.text
        # Subscribed again and synced (redis-py reconnects, or the thread does).
        assert view.wait_until(lambda v: v.trusted and v.counts.syncs >= 2, WAIT)
        assert not view._closing.hides(key_of("tf-view", "gone"))
    finally:
        store.close()


def test_a_paused_server_sends_gates_back_to_the_store(own_redis: OwnRedis) -> None:
    """SIGSTOP: the view hears nothing and stops answering within STALE_AFTER; a gate is then
    a round trip again, which times out and fails closed (or open) as configured."""
    store = RedisStore.from_url(own_redis.url, prefix="tf-view")
    fuse = Fuse(store, velocity=POLICY, fail_closed=True)
    view = view_of(store)
    assert own_redis.process is not None
    pid = own_redis.process.pid
    try:
        assert view.wait_synced(WAIT)
        assert fuse.gate("k").allowed
        os.kill(pid, signal.SIGSTOP)
        try:
            assert view.wait_until(lambda v: not v.trusted, STALE_AFTER + WAIT)
            with pytest.raises(StoreUnavailable):
                fuse.gate("k")
            assert view.counts.lost >= 1
        finally:
            os.kill(pid, signal.SIGCONT)
        assert view.wait_until(lambda v: v.trusted, WAIT)
        assert fuse.gate("k").allowed
    finally:
        store.close()


def test_a_store_dropped_without_close_takes_its_thread_along(
    redis_url: str, redis_prefix: str
) -> None:
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    view = view_of(store)
    assert view.wait_synced(WAIT)
    thread = view._thread
    assert thread is not None and thread.is_alive()
    del store, view
    thread.join(WAIT)
    assert not thread.is_alive()


def test_a_reset_is_learned_by_every_view(two_stores: tuple[RedisStore, RedisStore]) -> None:
    a, b = two_stores
    assert view_of(a).wait_synced(WAIT) and view_of(b).wait_synced(WAIT)
    key = key_of(a.prefix, "r")
    a.run(Record("r", 500.0, POLICY))
    assert view_of(b).wait_until(lambda v: key in v._open, WAIT)
    a.run(Reset("r"))
    assert view_of(b).wait_until(lambda v: key not in v._open, WAIT)
    assert b.run(Gate("r")).allowed


def test_a_forgive_is_learned_by_every_view_like_a_reset(
    two_stores: tuple[RedisStore, RedisStore],
) -> None:
    a, b = two_stores
    assert view_of(a).wait_synced(WAIT) and view_of(b).wait_synced(WAIT)
    key = key_of(a.prefix, "f")
    a.run(Record("f", 500.0, POLICY))
    assert view_of(b).wait_until(lambda v: key in v._open, WAIT)
    client = b._clients.sync_client()
    marker = f"{b.prefix}:open:{{f}}"
    assert client.exists(marker)
    a.run(Forgive("f"))
    assert view_of(a).answer(key) is not None  # its own mark forgotten at once
    assert view_of(b).wait_until(lambda v: key not in v._open, WAIT)
    assert not client.exists(marker)
    assert b.run(Gate("f")).allowed


def test_a_trip_heard_after_this_process_forgave_the_key_does_not_reopen_it(
    behind: HeldAnnouncements,
) -> None:
    """The subscriber thread may run behind this process's own decisions (a busy machine):
    the trip's announcement can arrive after this process forgave the key. It is older than
    the forgive, so it must not refuse the key again until the forgive's own announcement
    comes; a trip announced after that one is newer, and is heard as ever."""
    store, view = behind.store, behind.view
    key = key_of(store.prefix, "k")
    assert store.run(Record("k", 500.0, POLICY)).tripped
    store.run(Forgive("k"))
    opened, closed = behind.wait_for(2)
    assert opened.startswith("o ") and closed.startswith("c ")

    OpenKeys.apply(view, opened)  # heard after the forgive, published before it
    assert store.run(Gate("k")).allowed
    assert view.counts.stale == 1
    OpenKeys.apply(view, closed)
    assert store.run(Gate("k")).allowed

    assert behind.other.run(Record("k", 500.0, POLICY)).tripped  # newer than the forgive
    (reopened,) = behind.wait_for(3)[2:]
    OpenKeys.apply(view, reopened)
    refused = view.answer(key)
    assert refused is not None and not refused.allowed
    assert refused == behind.other.run(Gate("k"))  # the store's own refusal


def test_a_close_hides_what_is_heard_of_it_until_its_own_announcement(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    closes = _Unheard(now=clock)
    assert not closes.hides("k")
    closes.closed("k")
    closes.closed("k")  # reset twice before either announcement is heard
    assert closes.hides("k") and not closes.hides("other")
    closes.heard("k")
    assert closes.hides("k")  # what comes between the two resets is older than the second
    closes.heard("k")
    assert not closes.hides("k")

    closes.closed("k")  # never heard back: hides nothing once the view would be stale
    clock.advance(STALE_AFTER)
    assert closes.hides("k")
    clock.advance(0.001)
    assert not closes.hides("k")

    monkeypatch.setattr(open_keys, "MAX_LOOPS", 3)
    for name in "abcd":
        closes.closed(name)
    assert [closes.hides(name) for name in "abcd"] == [False, True, True, True]
    closes.clear()
    assert not any(closes.hides(name) for name in "abcd")


@pytest.mark.parametrize(("reason", "policy", "op"), TRIPS)
def test_a_trip_of_any_rule_reaches_every_view_with_the_stores_own_refusal(
    two_stores: tuple[RedisStore, RedisStore],
    redis_url: str,
    redis_prefix: str,
    reason: str,
    policy: VelocityPolicy,
    op: Op[object],
) -> None:
    a, b = two_stores
    assert view_of(b).wait_synced(WAIT)
    a.run(op)
    key = key_of(b.prefix, "t")
    assert view_of(b).wait_until(lambda v: key in v._open, WAIT)
    from_view = view_of(b).answer(key)
    direct = RedisStore.from_url(redis_url, prefix=redis_prefix, open_keys=False)
    try:
        from_store = direct.run(Gate("t"))
    finally:
        direct.close()
    assert from_view is not None and not from_view.allowed
    assert from_view.reason == from_store.reason == reason
    assert from_view.window == from_store.window is not None
    assert (from_view.rate, from_view.limit, from_view.baseline) == (
        from_store.rate,
        from_store.limit,
        from_store.baseline,
    )


def test_a_key_this_process_tripped_is_allowed_again_once_the_store_says_so(
    two_stores: tuple[RedisStore, RedisStore],
) -> None:
    """Reset elsewhere: this process's own mark stays until a gate asks the store."""
    a, b = two_stores
    assert view_of(a).wait_synced(WAIT)
    a.run(Record("r", 500.0, POLICY))
    b.run(Reset("r"))
    rounds = view_of(a).counts.round_trips
    assert a.run(Gate("r")).allowed  # the store's answer
    assert view_of(a).counts.round_trips == rounds + 1
    assert a.run(Gate("r")).allowed  # and the view's, from now on
    assert view_of(a).counts.round_trips == rounds + 1


def test_a_synced_view_gates_even_when_every_connection_is_busy(
    redis_url: str, redis_prefix: str
) -> None:
    """The subscription has a connection of its own: a burst that holds the whole pool of
    decisions does not hold up the gates."""
    store = RedisStore.from_url(redis_url, prefix=redis_prefix, max_connections=1)
    try:
        assert view_of(store).wait_synced(WAIT)
        store.run(Gate("k"))  # the pool's one connection exists
        pool = store._clients.sync_client().connection_pool
        held = pool.get_connection()
        try:
            assert store.run(Gate("k")).allowed
        finally:
            pool.release(held)
    finally:
        store.close()


def test_a_batch_trip_refuses_the_next_gate_at_once(redis_url: str, redis_prefix: str) -> None:
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    try:
        assert view_of(store).wait_synced(WAIT)
        verdicts = store.run_many([RecordBatch("b", (50.0, 60.0, 10.0), POLICY)])
        assert verdicts[0].tripped and verdicts[0].rate == 110.0  # the first trip's verdict
        assert not store.run(Gate("b")).allowed
    finally:
        store.close()


def _sockets_to(url: str) -> set[str]:
    """The inodes of this process's TCP sockets connected to the server of ``url``."""
    port = f":{redis.connection.parse_url(url).get('port', 6379):04X}"
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # an fd closed while listing
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                ours.add(target[len("socket:[") : -1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[2].endswith(port) and fields[9] in ours:
                    found.add(fields[9])
    return found


needs_proc = pytest.mark.skipif(
    not os.path.exists("/proc/self/fd"), reason="counts sockets through /proc"
)


@needs_proc
def test_closing_a_store_closes_every_socket_it_opened(redis_url: str, redis_prefix: str) -> None:
    """The decisions' client, the subscriber's own client (subscription, SCAN, GET) and the
    event log's reader: none is left for the collector."""
    before = _sockets_to(redis_url)
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    fuse = Fuse(store, velocity=POLICY)
    assert fuse.record("agent", 500).tripped  # a marker for the subscriber's sync to read
    assert view_of(store).wait_synced(WAIT)
    assert not fuse.gate("agent").allowed
    store.events.read("0", 10, 0.01)  # the reader client, for blocking reads
    assert len(_sockets_to(redis_url) - before) >= 3  # decisions, subscription, reader

    store.close()

    assert _sockets_to(redis_url) - before == set()


@needs_proc
async def test_closing_an_async_store_closes_every_socket_it_opened(
    redis_url: str, redis_prefix: str
) -> None:
    before = _sockets_to(redis_url)
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    fuse = Fuse(store, velocity=POLICY)
    assert (await fuse.arecord("agent", 500)).tripped
    assert view_of(store).wait_synced(WAIT)
    assert not (await fuse.agate("agent")).allowed
    await store.events.aread("0", 10, 0.01)
    store.events.read("0", 10, 0.01)
    assert len(_sockets_to(redis_url) - before) >= 4

    await store.aclose()

    assert _sockets_to(redis_url) - before == set()


@pytest.mark.cluster
def test_on_a_cluster_every_node_s_trips_reach_the_view(cluster_url: str) -> None:
    """Keys on every primary: the markers are found by a SCAN of each, and a plain PUBLISH
    reaches a subscription on any node."""
    from redis.cluster import RedisCluster

    prefix = f"tf-view-{uuid.uuid4().hex[:8]}"
    url = cluster_url.replace("redis://", "redis+cluster://")
    first = RedisStore.from_url(url, prefix=prefix)
    late = RedisStore.from_url(url, prefix=prefix)
    try:
        early = [f"early-{n}" for n in range(6)]  # spread over the slots, so over the nodes
        for key in early:
            first.run(Record(key, 500.0, POLICY))
        view = view_of(late)
        assert view.wait_synced(WAIT)
        assert all(not late.run(Gate(key)).allowed for key in early)
        first.run(Record("late", 500.0, POLICY))
        assert view.wait_until(lambda v: key_of(prefix, "late") in v._open, WAIT)
        assert not late.run(Gate("late")).allowed
        assert view.counts.round_trips == 0
    finally:
        first.close()
        late.close()
        cleanup = RedisCluster.from_url(cluster_url)
        for name in cleanup.scan_iter(match=f"{prefix}*"):
            cleanup.delete(name)
        cleanup.close()
