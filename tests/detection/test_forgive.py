"""``forgive``: an operator marks a trip as legitimate, and the key learns it for that hour.

Blind spot (4) of the first velocity check, replayed, then the operation on every store
(memory, real Redis sync and asyncio, fakeredis) and through ``Fuse`` on real Redis.
"""

from __future__ import annotations

import random
import uuid

import pytest
import redis
import redis.asyncio
from benchmarks.detection_scenarios import (
    DAY,
    HOUR,
    MINUTE,
    Scenario,
    Traffic,
    daily_pulse,
    normal,
    poisson,
    replay,
)

from tests.conftest import Clock
from tests.stores.conftest import Backend, delete_prefix
from tokenfuse import Fuse, VelocityPolicy
from tokenfuse._stores.ops import Forgive, Gate, ReadStatus, Record
from tokenfuse._stores.redis import RedisStore

# -- (4): a nightly batch, forgiven once -----------------------------------------------------------

NIGHTS = 6.0


def nightly_then_noon(rng: random.Random) -> Traffic:
    """200 tokens/min all day, a 20-minute batch at 10,000/min every night at 02:00, and on
    the last day the same batch at noon."""
    return normal(
        poisson(rng, 0.0, (NIGHTS + 1) * DAY, 200, size=100),
        daily_pulse(rng, NIGHTS + 1, 2 * HOUR, 20 * MINUTE, 10_000, 500),
        poisson(rng, NIGHTS * DAY + 12 * HOUR, NIGHTS * DAY + 12 * HOUR + 20 * MINUTE, 10_000,
                size=500),
    )  # fmt: skip


def test_a_forgiven_nightly_batch_passes_on_the_following_nights_but_not_at_noon() -> None:
    scenario = Scenario(
        "nightly batch", "blind spot", NIGHTS + 1, nightly_then_noon, forgive=True, stop=False
    )
    out = replay(scenario)
    # Nights 0-2 pass under cold start; the first night the baseline is established, the
    # batch (50x the day's rate) trips, and the operator forgives it.
    first = out.trips[0][0]
    assert 3 * DAY + 2 * HOUR <= first < 3 * DAY + 3 * HOUR
    assert out.forgiven_at is not None and out.forgiven_at - first < MINUTE
    after = [t for t, _, _ in out.trips if t > out.forgiven_at]
    # Nights 4, 5 and 6 pass; the same batch at noon on day 6 still trips.
    assert after and all(NIGHTS * DAY + 12 * HOUR <= t < NIGHTS * DAY + 13 * HOUR for t in after)


def test_without_forgive_the_batch_trips_every_night() -> None:
    scenario = Scenario("nightly batch", "blind spot", NIGHTS, nightly_then_noon, stop=False)
    nights = {int(t // DAY) for t, _, _ in replay(scenario).trips}
    assert nights == {3, 4, 5}


# -- the operation on every store ------------------------------------------------------------------

QUICK = VelocityPolicy(learning_period=0, min_samples=3, cold_start_limit=None, cooldown=30)


async def learned(backend: Backend, key: str = "k") -> None:
    """30 minutes of 100 per minute (a call a minute), ending at 12:00 UTC."""
    backend.clock.now = 1_767_225_600.0 + 11.5 * HOUR
    for _ in range(30):
        assert (await backend.run(Record(key, 100, QUICK))).allowed
        backend.clock.advance(60)


async def batch(backend: Backend, key: str = "k") -> bool:
    """Five minutes of 2,000 per minute (20x), a call every 3 s: whether it all passed."""
    for _ in range(100):
        if not (await backend.run(Gate(key))).allowed:
            return False
        await backend.run(Record(key, 100, QUICK))
        backend.clock.advance(3)
    return True


async def test_forgive_reopens_the_key_and_teaches_the_hour(backend: Backend, clock: Clock) -> None:
    await learned(backend)
    assert not await batch(backend)  # 12:00: tripped
    await backend.run(Forgive("k"))
    assert (await backend.run(Gate("k"))).allowed
    assert (await backend.run(ReadStatus("k", QUICK, None))).open_until is None

    clock.now = 1_767_225_600.0 + 18 * HOUR  # 18:00: the same batch is a loop
    assert not await batch(backend)
    clock.now = 1_767_225_600.0 + DAY + 13 * HOUR  # the hour after the trip's is taught too
    assert await batch(backend)


async def test_forgive_teaches_nothing_for_a_manual_ceiling(backend: Backend, clock: Clock) -> None:
    ceiling = VelocityPolicy(limit=100, cooldown=30)
    assert not (await backend.run(Record("k", 500, ceiling))).allowed
    await backend.run(Forgive("k"))
    assert (await backend.run(Gate("k"))).allowed
    clock.advance(MINUTE)
    assert not (await backend.run(Record("k", 500, ceiling))).allowed  # the limit still holds


async def test_forgiving_an_unknown_key_changes_nothing(backend: Backend) -> None:
    await backend.run(Forgive("never-seen"))
    assert (await backend.run(ReadStatus("never-seen", QUICK, None))).first_seen is None
    if backend.raw is not None:
        assert backend.raw.exists(backend.key("never-seen")) == 0


# -- through Fuse, on the real Redis ---------------------------------------------------------------


@pytest.mark.redis
async def test_fuse_forgive_and_aforgive_on_redis(redis_url: str, clock: Clock) -> None:
    prefix = f"tf-i9-{uuid.uuid4().hex[:8]}"
    sync_client = redis.Redis.from_url(redis_url)
    async_client = redis.asyncio.Redis.from_url(redis_url)
    one = Fuse(RedisStore(sync_client, prefix=prefix, clock=clock), velocity=QUICK)
    two = Fuse(RedisStore(async_client, prefix=prefix, clock=clock), velocity=QUICK)

    def twenty_x(who: str) -> bool:
        """Five minutes at 20x a baseline of 100/min: whether every call passed."""
        for _ in range(100):
            if not one.gate(who).allowed:
                return False
            one.record(who, 100)
            clock.advance(3)
        return True

    try:
        for who in ("forgiven-sync", "forgiven-async"):
            clock.now = 1_767_225_600.0 + 9.5 * HOUR
            for _ in range(30):
                one.record(who, 100)
                clock.advance(60)
            assert not twenty_x(who)
            assert not (await two.agate(who)).allowed  # another process sees the trip
            if who.endswith("async"):
                await two.aforgive(who)
            else:
                one.forgive(who)
            assert one.gate(who).allowed and (await two.agate(who)).allowed
            assert twenty_x(who)  # taught, for every process
    finally:
        delete_prefix(sync_client, prefix)
        sync_client.close()
        await async_client.aclose()
