"""Tripped calls in the open-key view: a loop check asked "is this call tripped?"
(``CheckLoops.local``) answered without a round trip, learned from every process's trips and
forgets, and the round trip again whenever the view cannot be trusted.

Two stores on one server stand for two processes (each has its own view, connection and
thread), as in test_open_keys.py. "No round trip" is proven by the loop string itself: every
``check_loops`` script writes it (the call's ``last_seen``), so a string unchanged while the
clock moved on was not touched by a script. Waits end on the view's change notifications.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.conftest import Clock
from tests.stores.conftest import HeldAnnouncements
from tokenfuse import Identity
from tokenfuse._core.loops import LoopPolicy
from tokenfuse._stores.open_keys import OpenKeys
from tokenfuse._stores.ops import CheckLoops, ForgetLoops, NoteLoop, NoteLoopBatch
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_codec import loop_state, loops_key_of

pytestmark = pytest.mark.redis

POLICY = LoopPolicy(failures=3, failure_window=120, cooldown=60)
KEY = "default:" + "cd" * 16
CALL = "0123456789abcdef"
OTHER = "fedcba9876543210"
WAIT = 5.0


def view_of(store: RedisStore) -> OpenKeys:
    assert store.open_keys is not None
    return store.open_keys


def trip(store: RedisStore, fingerprint: str = CALL) -> None:
    verdicts = [store.run(NoteLoop(KEY, fingerprint, POLICY, True, 500)) for _ in range(3)]
    assert [v.tripped for v in verdicts] == [False, False, True]


def check(fingerprint: str = CALL) -> CheckLoops:
    return CheckLoops(KEY, fingerprint, POLICY, local=True)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as client:
        yield client


@pytest.fixture
def two_stores(
    redis_url: str, redis_prefix: str, clock: Clock
) -> Iterator[tuple[RedisStore, RedisStore]]:
    stores = (
        RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock),
        RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock),
    )
    yield stores
    for store in stores:
        store.close()


def test_a_trip_in_one_process_is_refused_in_another_without_a_round_trip(
    two_stores: tuple[RedisStore, RedisStore], client: redis.Redis, clock: Clock
) -> None:
    a, b = two_stores
    view = view_of(b)
    assert view.wait_synced(WAIT)
    loops = loops_key_of(b.prefix, KEY)

    trip(a)
    assert view.wait_until(lambda v: (loops, CALL) in v._loops, WAIT)
    before = client.get(loops)
    local, round_trips = view.counts.loop_local, view.counts.loop_round_trips
    clock.advance(10)

    refused = b.run(check())

    assert not refused.allowed and refused.reason == "failure_loop"
    assert (refused.count, refused.failures, refused.status) == (3.0, 3.0, 500.0)
    assert refused.retry_after == pytest.approx(50.0)  # 60 s cooldown, 10 s later
    assert view.counts.loop_local == local + 1
    assert view.counts.loop_round_trips == round_trips
    assert client.get(loops) == before  # no script ran: the string was not written
    # The store's own answer is the same refusal.
    asked = b.run(CheckLoops(KEY, CALL, POLICY))
    assert (asked.allowed, asked.reason, asked.count) == (False, "failure_loop", 3.0)
    assert asked.retry_after == pytest.approx(refused.retry_after)


def test_an_allowed_call_is_answered_locally_and_counts_no_send(
    two_stores: tuple[RedisStore, RedisStore], client: redis.Redis, clock: Clock
) -> None:
    a, b = two_stores
    view = view_of(b)
    assert view.wait_synced(WAIT)
    a.run(CheckLoops(KEY, CALL, POLICY))  # the string exists
    loops = loops_key_of(b.prefix, KEY)
    before = client.get(loops)
    clock.advance(1)

    allowed = [b.run(check()) for _ in range(5)]

    assert all(v.allowed and v.failures == 0 for v in allowed)
    assert view.counts.loop_local == 5 and view.counts.loop_round_trips == 0
    assert client.get(loops) == before
    # A check without ``local`` is a round trip, as before: the send is counted.
    assert b.run(CheckLoops(KEY, CALL, POLICY)).count == 2.0
    assert view.counts.loop_local == 5


def test_an_admission_s_check_is_answered_or_counted_once(
    redis_url: str, redis_prefix: str, clock: Clock, client: redis.Redis
) -> None:
    """``Fuse.admit_with`` asks the view first (``RedisStore.known``) and, when it has no
    answer, sends the check in the pipeline, which asks again: the miss is counted once.
    Answered, the admission goes alone and the loop string is not touched."""
    from tokenfuse import Fuse

    store = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock)
    fuse = Fuse(store, name="inbound")
    check = CheckLoops(fuse._key(Identity.of("agent")), CALL, POLICY, local=True)
    try:
        view = view_of(store)
        assert not view.trusted  # nothing asked it yet: its thread is not running
        decision, found = fuse.admit_with("agent", [check])
        assert decision.allowed and found is not None and found[0].allowed
        assert (view.counts.loop_round_trips, view.counts.loop_local) == (1, 0)
        assert view.wait_synced(WAIT)
        loops = loops_key_of(redis_prefix, check.key)
        before = client.get(loops)
        clock.advance(1)  # a script touching the string would write a new last_seen
        decision, found = fuse.admit_with("agent", [check])
        assert decision.allowed and found is not None and found[0].allowed
        assert (view.counts.loop_round_trips, view.counts.loop_local) == (1, 1)
        assert client.get(loops) == before
    finally:
        store.close()


def test_forget_loops_in_one_process_lets_the_call_through_in_another(
    two_stores: tuple[RedisStore, RedisStore],
) -> None:
    a, b = two_stores
    view = view_of(b)
    assert view.wait_synced(WAIT)
    loops = loops_key_of(b.prefix, KEY)
    trip(a)
    trip(a, OTHER)
    assert view.wait_until(lambda v: (loops, OTHER) in v._loops, WAIT)
    assert not b.run(check()).allowed

    assert a.run(ForgetLoops(KEY, CALL)) == 1
    assert view.wait_until(lambda v: (loops, CALL) not in v._loops, WAIT)
    assert b.run(check()).allowed
    assert not b.run(check(OTHER)).allowed  # only the call forgotten

    assert a.run(ForgetLoops(KEY)) == 1  # every call left ('*')
    assert view.wait_until(lambda v: (loops, OTHER) not in v._loops, WAIT)
    assert b.run(check(OTHER)).allowed
    assert view.counts.loop_round_trips == 0


@pytest.mark.parametrize("forgotten", [CALL, ""], ids=["the call", "every call"])
def test_a_trip_heard_after_this_process_forgot_the_call_does_not_trip_it_again(
    behind: HeldAnnouncements, forgotten: str
) -> None:
    """As for keys (test_open_keys.py): the trip's announcement, heard only after this
    process forgot the call, is older than the forget; one made after it is heard."""
    store, view = behind.store, behind.view
    trip(store)
    assert store.run(ForgetLoops(KEY, forgotten)) == 1
    tripped, forgot = behind.wait_for(2)
    assert tripped.startswith("l ") and forgot.startswith("f ")

    OpenKeys.apply(view, tripped)  # heard after the forget, published before it
    assert store.run(check()).allowed
    assert view.counts.stale == 1
    OpenKeys.apply(view, forgot)
    assert store.run(check()).allowed

    trip(behind.other)  # newer than the forget
    (again,) = behind.wait_for(3)[2:]
    OpenKeys.apply(view, again)
    rounds = view.counts.loop_round_trips
    assert not store.run(check()).allowed
    assert view.counts.loop_round_trips == rounds  # refused by the view itself
    assert view.counts.stale == 1


def test_a_trip_made_before_the_subscription_is_found_by_the_sync(
    redis_url: str, redis_prefix: str, clock: Clock, client: redis.Redis
) -> None:
    a = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock, open_keys=False)
    trip(a)
    marker = f"{redis_prefix}:open-loop:{{{KEY}}}:{CALL}"
    assert 0 < client.pttl(marker) <= 60_000  # expires with the cooldown
    b = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock)
    try:
        view = view_of(b)
        assert view.wait_synced(WAIT)
        refused = b.run(check())
        assert not refused.allowed and refused.count == 3.0
        assert view.counts.loop_local == 1 and view.counts.loop_round_trips == 0
        a.run(ForgetLoops(KEY, CALL))
        assert client.exists(marker) == 0  # forget deletes the marker
    finally:
        a.close()
        b.close()


def test_an_untrusted_view_sends_the_check_to_the_store(
    redis_url: str, redis_prefix: str, clock: Clock, client: redis.Redis
) -> None:
    a = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock, open_keys=False)
    b = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock)
    try:
        trip(a)
        view = view_of(b)
        loops = loops_key_of(redis_prefix, KEY)
        # Not synced yet (the first check starts the thread): the store answers.
        refused = b.run(check())
        assert not refused.allowed and refused.count == 3.0
        assert view.counts.loop_round_trips == 1 and view.counts.loop_local == 0
        # A view whose subscription is gone (closed): the store answers, counting no send
        # and writing nothing, as the view would (the send is counted by the note after it).
        assert view.wait_synced(WAIT)
        view.close()
        clock.advance(61)  # the cooldown is over
        before = client.get(loops)
        assert b.run(check()).allowed
        assert view.counts.loop_round_trips == 2
        assert client.get(loops) == before
        b.run(NoteLoop(KEY, CALL, POLICY, False, send=True))
        state = loop_state(client.get(loops))
        assert [(c.last_seen, c.sends) for c in state.calls if c.fingerprint == CALL] == [
            (clock.now, 1.0)
        ]
    finally:
        a.close()
        b.close()


def test_a_trip_noted_in_this_process_is_refused_at_once_and_failures_seen_are_ended(
    redis_url: str, redis_prefix: str, clock: Clock
) -> None:
    store = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock)
    try:
        view = view_of(store)
        assert view.wait_synced(WAIT)
        store.run(NoteLoop(KEY, OTHER, POLICY, True, 404))
        seen = store.run(check(OTHER))
        # The failure this process saw: the caller will note the success that ends it.
        assert seen.allowed and seen.failures == 1.0
        store.run(NoteLoop(KEY, OTHER, POLICY, False))
        assert store.run(check(OTHER)).failures == 0.0
        trip(store)
        refused = store.run(check())  # the next check, with or without the announcement
        assert not refused.allowed and refused.reason == "failure_loop"
        assert refused.retry_after == pytest.approx(60.0)
        assert view.counts.loop_round_trips == 0
    finally:
        store.close()


@pytest.mark.cluster
def test_on_a_cluster_every_node_s_loop_trips_reach_the_view(cluster_url: str) -> None:
    """Identities on every primary: the loop markers are found by a SCAN of each (written in
    the identity's slot), and a trip or a forget on any node reaches the view."""
    import uuid

    from redis.cluster import RedisCluster

    prefix = f"tf-loopview-{uuid.uuid4().hex[:8]}"
    url = cluster_url.replace("redis://", "redis+cluster://")
    first = RedisStore.from_url(url, prefix=prefix)
    late = RedisStore.from_url(url, prefix=prefix)
    keys = [f"default:{n:032x}" for n in range(6)]  # spread over the slots, so over the nodes
    try:
        for key in keys:
            for _ in range(3):
                first.run(NoteLoop(key, CALL, POLICY, True, 500))
        view = view_of(late)
        assert view.wait_synced(WAIT)
        assert all(not late.run(CheckLoops(key, CALL, POLICY, local=True)).allowed for key in keys)
        first.run(ForgetLoops(keys[0]))
        gone = (loops_key_of(prefix, keys[0]), CALL)
        assert view.wait_until(lambda v: gone not in v._loops, WAIT)
        assert late.run(CheckLoops(keys[0], CALL, POLICY, local=True)).allowed
        assert view.counts.loop_round_trips == 0 and view.counts.loop_local == 7
    finally:
        first.close()
        late.close()
        cleanup = RedisCluster.from_url(cluster_url)
        for name in cleanup.scan_iter(match=f"{prefix}*"):
            cleanup.delete(name)
        cleanup.close()


@pytest.mark.cluster
def test_on_a_cluster_batched_notes_trip_calls_on_every_node(cluster_url: str) -> None:
    """The background recorder's shape: one ``NoteLoopBatch`` per identity, all in one
    pipeline that reaches every primary. Each trip is marked in the noting process's view as
    its verdict comes back (checked at once, no announcement awaited) and announced to the
    others; every send is counted once."""
    import uuid

    from redis.cluster import RedisCluster

    prefix = f"tf-loopbatch-{uuid.uuid4().hex[:8]}"
    url = cluster_url.replace("redis://", "redis+cluster://")
    noting = RedisStore.from_url(url, prefix=prefix)
    other = RedisStore.from_url(url, prefix=prefix)
    keys = [f"default:{n:032x}" for n in range(6)]
    try:
        assert view_of(noting).wait_synced(WAIT) and view_of(other).wait_synced(WAIT)
        batches = [
            NoteLoopBatch(key, POLICY, (NoteLoop(key, CALL, POLICY, True, 500, send=True),) * 3)
            for key in keys
        ]
        results = noting.run_many(batches)
        assert [[v.tripped for v in verdicts] for verdicts in results] == [
            [False, False, True]
        ] * len(keys)
        assert all(
            not noting.run(CheckLoops(key, CALL, POLICY, local=True)).allowed for key in keys
        )
        assert view_of(noting).counts.loop_round_trips == 0
        calls = (loops_key_of(prefix, key) for key in keys)
        wanted = {(loops, CALL) for loops in calls}
        assert view_of(other).wait_until(lambda v: wanted <= v._loops.keys(), WAIT)
        cluster = RedisCluster.from_url(cluster_url)
        try:
            for key in keys:
                [call] = loop_state(cluster.get(loops_key_of(prefix, key))).calls
                assert (call.sends, call.failures) == (3, 3)
        finally:
            cluster.close()
    finally:
        noting.close()
        other.close()
        cleanup = RedisCluster.from_url(cluster_url)
        for name in cleanup.scan_iter(match=f"{prefix}*"):
            cleanup.delete(name)
        cleanup.close()


def test_a_full_view_sends_the_checks_to_the_store_never_allowing_a_tripped_call(
    two_stores: tuple[RedisStore, RedisStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenfuse._stores import open_keys

    monkeypatch.setattr(open_keys, "MAX_LOOPS", 1)
    a, b = two_stores
    view = view_of(b)
    assert view.wait_synced(WAIT)
    loops = loops_key_of(b.prefix, KEY)
    trip(a)
    assert view.wait_until(lambda v: (loops, CALL) in v._loops, WAIT)
    trip(a, OTHER)  # no room for it in the view
    assert view.wait_until(lambda v: v._loops_full, WAIT)
    assert (loops, OTHER) not in view._loops

    refused = b.run(check(OTHER))

    assert not refused.allowed and refused.reason == "failure_loop"  # the store's answer
    assert view.counts.loop_round_trips == 1 and view.counts.loop_local == 0
