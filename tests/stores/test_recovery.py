"""Coming back from an outage: soon, and reported once.

``store_recovered`` pairs with a reported ``store_unavailable`` (a store that flaps, or a
cluster with one dead node, must not page "recovered" on every success), and enforcement
resumes within 5 s of the store returning, however long the outage was. Clocks are injected;
the outages are real redis-servers of the tests' own, stopped and started by PID.
"""

from __future__ import annotations

import random

from tests.conftest import Clock
from tests.stores.conftest import OwnRedis
from tokenfuse import Fuse, FuseEvent, StoreUnavailable, VelocityPolicy
from tokenfuse._errors import StoreBusy
from tokenfuse._health import StoreHealth
from tokenfuse._stores.redis import RedisStore


def kinds(events: list[FuseEvent | None]) -> list[str]:
    return [event.kind for event in events if event is not None]


def test_a_flapping_store_reports_one_outage_and_one_recovery(clock: Clock) -> None:
    health = StoreHealth(clock=clock)
    events = []
    for _ in range(50):  # keys on a dead node fail, keys on the others succeed, interleaved
        events.append(health.failed(StoreUnavailable("node down")))
        events.append(health.succeeded())
        clock.advance(0.5)
    assert kinds(events) == ["store_unavailable", "store_recovered"]
    assert (health.counts.outages, health.counts.recoveries, health.counts.failed) == (1, 1, 50)
    clock.advance(60)  # a new outage after log_every: reported, and so is its end
    assert kinds([health.failed(StoreUnavailable("down")), health.succeeded()]) == [
        "store_unavailable",
        "store_recovered",
    ]


def test_back_pressure_is_never_followed_by_a_recovery(clock: Clock) -> None:
    health = StoreHealth(clock=clock)
    events = [health.failed(StoreBusy("pool full")) for _ in range(5)]
    events.append(health.succeeded())
    assert kinds(events) == ["pool_exhausted"]
    assert health.counts.pool_exhausted == 5 and health.counts.failed == 0


def test_the_back_off_never_exceeds_five_seconds(clock: Clock) -> None:
    health = StoreHealth(clock=clock)
    for _ in range(40):  # a long outage: each probe fails
        health.failed(StoreUnavailable("down"))
    assert not health.available()
    clock.advance(4.99)
    assert not health.available()
    clock.advance(0.01)
    assert health.available()


def test_a_store_that_answers_some_calls_is_never_skipped(clock: Clock) -> None:
    health = StoreHealth(clock=clock)
    rng = random.Random(3)
    for _ in range(3000):  # a third of the keys live on a dead node: runs of failures
        clock.advance(0.01)
        assert health.available()
        if rng.random() < 1 / 3:
            health.failed(StoreUnavailable("node down"))
        else:
            health.succeeded()
    assert health.counts.skipped == 0 and health.counts.failed > 900


def test_a_store_that_stops_answering_is_skipped_after_a_quiet_second(clock: Clock) -> None:
    health = StoreHealth(clock=clock)
    health.succeeded()
    for _ in range(4):  # 0, 0.25, 0.5, 0.75 s after the last answer
        health.failed(StoreUnavailable("down"))
        clock.advance(0.25)
        assert health.available()
    health.failed(StoreUnavailable("down"))  # a second without an answer
    assert not health.available()


def fuse_on(server: OwnRedis, clock: Clock, events: list[FuseEvent]) -> Fuse:
    store = RedisStore.from_url(server.url, clock=clock)
    return Fuse(store, velocity=VelocityPolicy(limit=100), on_event=events.append,
                health=StoreHealth(clock=clock))  # fmt: skip


def test_enforcement_resumes_within_five_seconds_of_redis_returning(
    own_redis: OwnRedis, clock: Clock
) -> None:
    events: list[FuseEvent] = []
    fuse = fuse_on(own_redis, clock, events)
    assert fuse.record("k", 10).allowed
    own_redis.stop()
    for _ in range(600):  # ten minutes down, a decision a second: every probe fails
        assert fuse.record("k", 10).degraded
        clock.advance(1)
    for _ in range(100):  # the worst moment for it to return: right after a failed probe
        if fuse.health.available():
            break
        clock.advance(0.25)  # (quarter seconds add up exactly: no float drift in the lag)
    assert fuse.record("k", 10).degraded
    own_redis.start()
    returned = clock.now
    while fuse.record("k", 10).degraded:  # decisions every 250 ms from the moment it is back
        clock.advance(0.25)
        assert clock.now - returned <= 5.0, "enforcement did not resume within 5 s"
    print(f"enforcing again {clock.now - returned:.2f} s after the server returned")  # -rP
    assert clock.now - returned <= 5.0
    # Reported when it started and again each minute it lasted (0, 60, ..., 600 s); its end,
    # once.
    assert [e.kind for e in events] == ["store_unavailable"] * 11 + ["store_recovered"]
    assert (fuse.health.counts.outages, fuse.health.counts.recoveries) == (1, 1)
    fuse.store.close()  # type: ignore[union-attr]


def test_a_restarting_server_pages_once_per_reported_outage(
    own_redis: OwnRedis, clock: Clock
) -> None:
    events: list[FuseEvent] = []
    fuse = fuse_on(own_redis, clock, events)
    for _ in range(4):  # four short outages within a minute
        assert not fuse.record("k", 1).degraded
        own_redis.stop()
        assert fuse.record("k", 1).degraded
        own_redis.start()
        clock.advance(5)
    assert not fuse.record("k", 1).degraded
    assert [e.kind for e in events] == ["store_unavailable", "store_recovered"]
    assert fuse.health.counts.failed == 4
    fuse.store.close()  # type: ignore[union-attr]
