"""A real Redis that is not there, or goes away mid-test and comes back.

A server that goes away is one of the test's own (``own_redis``): it stops only that process,
by PID.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Clock
from tests.stores.conftest import OwnRedis
from tokenfuse import Fuse, FuseEvent, StoreUnavailable, VelocityPolicy
from tokenfuse._health import StoreHealth
from tokenfuse._stores.redis import RedisStore


def make_fuse(url: str, clock: Clock, events: list[FuseEvent], **kwargs: object) -> Fuse:
    store = RedisStore.from_url(url, clock=clock)
    health = StoreHealth(threshold=3, backoff=5.0, clock=clock)
    return Fuse(store, velocity=VelocityPolicy(limit=100), on_event=events.append,
                health=health, **kwargs)  # type: ignore[arg-type]  # fmt: skip


def test_nothing_listening_fails_open_and_stops_asking(free_port: int, clock: Clock) -> None:
    events: list[FuseEvent] = []
    fuse = make_fuse(f"redis://127.0.0.1:{free_port}/0", clock, events)
    store = fuse.store
    assert isinstance(store, RedisStore)
    attempts = []
    run = store.run

    def counting_run(op: Any) -> Any:
        attempts.append(op)
        return run(op)

    store.run = counting_run  # type: ignore[method-assign]
    decisions = [fuse.record("k", 500) for _ in range(50)]
    assert all(d.allowed and d.degraded for d in decisions)
    assert [e.kind for e in events] == ["store_unavailable"]
    # Three connection attempts, then the store is skipped: 50 calls do not each pay a timeout.
    assert len(attempts) == 3
    clock.advance(5)  # the back-off is over: one probe, which fails and backs off again
    fuse.record("k", 500)
    assert len(attempts) == 4


def test_nothing_listening_fails_closed_when_asked(free_port: int, clock: Clock) -> None:
    fuse = make_fuse(f"redis://127.0.0.1:{free_port}/0", clock, [], fail_closed=True)
    with pytest.raises(StoreUnavailable):
        fuse.gate("k")


async def test_async_fails_open_too(free_port: int, clock: Clock) -> None:
    events: list[FuseEvent] = []
    fuse = make_fuse(f"redis://127.0.0.1:{free_port}/0", clock, events)
    decision = await fuse.arecord("k", 500)
    assert decision.allowed
    assert decision.degraded
    await fuse.store.aclose()  # type: ignore[union-attr]


def test_server_stopped_mid_test_then_back(own_redis: OwnRedis, clock: Clock) -> None:
    events: list[FuseEvent] = []
    fuse = make_fuse(own_redis.url, clock, events)
    assert fuse.record("k", 50).allowed
    assert not fuse.record("k", 60).allowed  # 110/min: over the ceiling, tripped
    own_redis.stop()
    assert fuse.gate("k").degraded  # the trip cannot be read: fail open
    assert fuse.record("other", 500).degraded
    own_redis.start()  # a restarted server: no state, no scripts loaded (NOSCRIPT)
    clock.advance(5)  # past the back-off
    decision = fuse.record("k", 150)
    assert not decision.degraded
    assert decision.tripped  # decisions use Redis again, scripts reloaded
    assert [e.kind for e in events] == ["tripped", "store_unavailable", "store_recovered",
                                        "tripped"]  # fmt: skip


async def test_async_server_stopped_mid_test_then_back(own_redis: OwnRedis, clock: Clock) -> None:
    events: list[FuseEvent] = []
    fuse = make_fuse(own_redis.url, clock, events)
    assert (await fuse.arecord("k", 50)).allowed
    own_redis.stop()
    assert (await fuse.arecord("k", 50)).degraded
    own_redis.start()
    clock.advance(5)
    decision = await fuse.arecord("k", 150)
    assert not decision.degraded
    assert decision.tripped
    await fuse.store.aclose()  # type: ignore[union-attr]
