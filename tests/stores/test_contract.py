"""The store contract: every backend, sync or async, gives the same answers.

Backends (``conftest.BACKENDS``): MemoryStore, RedisStore on the real server through a sync
and an asyncio client, and RedisStore on fakeredis (Lua through lupa). All run on the
simulated ``clock``; the start of the test clock is a whole minute, so slots and minutes line
up with the numbers below.
"""

from __future__ import annotations

import pytest

from tests.conftest import Clock
from tests.stores.conftest import Backend, close_backend, open_backend
from tokenfuse import BucketPolicy, VelocityPolicy
from tokenfuse._core.status import Status
from tokenfuse._core.velocity import VelocityVerdict
from tokenfuse._stores.ops import Admit, Configure, Gate, ReadStatus, Record, Reset

CEILING = VelocityPolicy(limit=1000, cooldown=30)
OPEN = VelocityPolicy(cold_start_limit=None)  # nothing trips: watch the window
LEARNING = VelocityPolicy(
    learning_period=60, min_samples=3, min_baseline=10, cold_start_limit=None, cooldown=30
)


async def learn_baseline(backend: Backend, key: str, per_minute: float, minutes: int) -> None:
    """One call of ``per_minute`` at the start of each minute, then a quiet hour."""
    for _ in range(minutes):
        assert (await backend.run(Record(key, per_minute, LEARNING))).allowed
        backend.clock.advance(60)
    backend.clock.advance(3600)


# -- gate and record -------------------------------------------------------------------------------


async def test_an_unknown_key_is_closed(backend: Backend) -> None:
    assert await backend.run(Gate("nobody")) == VelocityVerdict(allowed=True)


async def test_manual_ceiling_trips_and_latches_for_the_cooldown(
    backend: Backend, clock: Clock
) -> None:
    first = await backend.run(Record("k", 400, CEILING))
    assert first == VelocityVerdict(allowed=True, rate=400.0, limit=1000.0)
    clock.advance(1)
    trip = await backend.run(Record("k", 700, CEILING))
    assert (trip.allowed, trip.tripped, trip.reason) == (False, True, "manual_ceiling")
    assert (trip.rate, trip.limit, trip.retry_after) == (1100.0, 1000.0, 30.0)
    assert (trip.baseline, trip.multiple) == (None, None)

    clock.advance(10)
    gated = await backend.run(Gate("k"))
    assert (gated.allowed, gated.tripped, gated.reason) == (False, False, "manual_ceiling")
    assert (gated.rate, gated.retry_after) == (1100.0, 20.0)
    # Paid-for calls that passed the gate before the trip still count, but cannot trip again.
    late = await backend.run(Record("k", 5000, CEILING))
    assert (late.allowed, late.tripped, late.retry_after) == (False, False, 20.0)

    clock.advance(20)
    assert (await backend.run(Gate("k"))).allowed


async def test_cold_start_ceiling_applies_without_a_baseline(backend: Backend) -> None:
    # without a ten-minute budget (which lets one minute spend it all), the floor is the ceiling
    policy = VelocityPolicy(cold_start_limit=500, cold_start_sustained=None)
    verdict = await backend.run(Record("k", 600, policy))
    assert (verdict.reason, verdict.limit, verdict.baseline) == ("cold_start_ceiling", 500.0, None)
    verdict = await backend.run(Record("k2", 600, VelocityPolicy(cold_start_limit=500)))
    assert verdict.allowed  # 600 is one call, under the ten minutes' budget (10 x 300)
    verdict = await backend.run(Record("k2", 600, VelocityPolicy(cold_start_limit=500)))
    assert (verdict.reason, verdict.limit) == ("cold_start_ceiling", 500.0)


async def test_the_window_slides_over_sixty_seconds(backend: Backend, clock: Clock) -> None:
    await backend.run(Record("k", 100, OPEN))
    clock.advance(30)
    assert (await backend.run(Record("k", 50, OPEN))).rate == 150.0
    clock.advance(32.5)  # the window starts halfway through the first 5 s slot
    assert (await backend.run(Record("k", 1, OPEN))).rate == 50.0 + 50.0 + 1.0
    rates = []
    for step in (2.5, 30, 30):
        clock.advance(step)
        status = await backend.run(ReadStatus("k", OPEN, None))
        rates.append(status.rate)
    assert rates == [51.0, 1.0, 0.0]


async def test_a_loop_over_the_learned_baseline_is_suspected(
    backend: Backend, clock: Clock
) -> None:
    await learn_baseline(backend, "k", 100, minutes=6)
    status = await backend.run(ReadStatus("k", LEARNING, None))
    assert (status.established, status.baseline) == (True, 100.0)

    verdicts = []
    for _ in range(11):  # eleven calls of 100 in one second: 1,100/min, 1,000 without the largest
        verdicts.append(await backend.run(Record("k", 100, LEARNING)))
    assert all(v.allowed for v in verdicts[:10])
    assert verdicts[9].multiple == 10.0
    trip = verdicts[10]
    assert (trip.tripped, trip.reason, trip.rate) == (True, "loop_suspected", 1100.0)
    assert (trip.limit, trip.baseline, trip.multiple) == (1000.0, 100.0, 11.0)


async def test_one_large_call_is_not_a_loop(backend: Backend, clock: Clock) -> None:
    await learn_baseline(backend, "k", 100, minutes=6)
    verdict = await backend.run(Record("k", 50_000, LEARNING))
    assert verdict.allowed
    assert verdict.multiple == 500.0


async def test_repeated_trips_lengthen_the_cooldown_up_to_the_cap(
    backend: Backend, clock: Clock
) -> None:
    policy = VelocityPolicy(limit=100, cooldown=10, cooldown_max=25)
    waits = []
    for _ in range(3):
        waits.append((await backend.run(Record("k", 200, policy))).retry_after)
        clock.advance(30)
    assert waits == [10.0, 20.0, 25.0]
    await backend.run(Reset("k"))
    assert (await backend.run(Record("k", 200, policy))).retry_after == 10.0


async def test_reset_closes_at_once_and_keeps_what_was_learned(
    backend: Backend, clock: Clock
) -> None:
    await learn_baseline(backend, "k", 100, minutes=6)
    for _ in range(11):
        await backend.run(Record("k", 100, LEARNING))
    assert not (await backend.run(Gate("k"))).allowed
    before = await backend.run(ReadStatus("k", LEARNING, None))

    await backend.run(Reset("k"))
    assert (await backend.run(Gate("k"))).allowed
    after = await backend.run(ReadStatus("k", LEARNING, None))
    assert after.rate == 0.0
    assert after.open_until is None
    assert (after.samples, after.learned_baseline) == (
        before.samples,
        before.learned_baseline,
    )


# -- admission -------------------------------------------------------------------------------------


async def test_bucket_bursts_to_capacity_then_refills(backend: Backend, clock: Clock) -> None:
    bucket = BucketPolicy(rate=1, capacity=3)
    taken = [await backend.run(Admit("k", cost=1, amount=0, velocity=None, bucket=bucket))]
    taken += [await backend.run(Admit("k", cost=1, amount=0, velocity=None, bucket=bucket))]
    taken += [await backend.run(Admit("k", cost=1, amount=0, velocity=None, bucket=bucket))]
    assert [t.allowed for t in taken] == [True, True, True]
    assert [t.bucket.remaining for t in taken if t.bucket] == [2.0, 1.0, 0.0]
    assert all(t.velocity is None for t in taken)

    refused = await backend.run(Admit("k", cost=1, amount=0, velocity=None, bucket=bucket))
    assert refused.bucket is not None
    assert (refused.allowed, refused.bucket.retry_after, refused.bucket.remaining) == (
        False,
        1.0,
        0.0,
    )
    clock.advance(0.5)
    half = await backend.run(Admit("k", cost=1, amount=0, velocity=None, bucket=bucket))
    assert half.bucket is not None
    assert (half.allowed, half.bucket.retry_after) == (False, 0.5)
    clock.advance(0.5)
    assert (await backend.run(Admit("k", cost=1, amount=0, velocity=None, bucket=bucket))).allowed


async def test_an_open_key_takes_nothing_from_its_bucket(backend: Backend) -> None:
    velocity = VelocityPolicy(limit=2, unit="calls")
    bucket = BucketPolicy(rate=1, capacity=10)
    verdicts = [
        await backend.run(Admit("k", cost=1, amount=1, velocity=velocity, bucket=bucket))
        for _ in range(4)
    ]
    assert [v.allowed for v in verdicts] == [True, True, False, False]
    assert verdicts[2].velocity is not None and verdicts[2].velocity.tripped
    assert verdicts[3].bucket is None  # the latch refused before the bucket was asked
    status = await backend.run(ReadStatus("k", velocity, bucket))
    assert status.bucket_level == 7.0  # three calls passed the latch


async def test_a_call_the_bucket_refuses_adds_nothing_to_the_rate(backend: Backend) -> None:
    bucket = BucketPolicy(rate=0.001, capacity=1)
    assert (await backend.run(Admit("k", cost=1, amount=1, velocity=OPEN, bucket=bucket))).allowed
    refused = await backend.run(Admit("k", cost=1, amount=1, velocity=OPEN, bucket=bucket))
    assert not refused.allowed
    assert refused.velocity == VelocityVerdict(allowed=True)  # the latch's verdict
    status = await backend.run(ReadStatus("k", OPEN, bucket))
    assert status.rate == 1.0


async def test_amount_zero_checks_the_latch_only(backend: Backend) -> None:
    verdict = await backend.run(Admit("k", cost=1, amount=0, velocity=OPEN, bucket=None))
    assert verdict.allowed
    assert verdict.velocity is None  # no state yet: nothing to check
    assert (await backend.run(ReadStatus("k", OPEN, None))).first_seen is None


async def test_near_limit_alert_fires_once_per_episode(backend: Backend, clock: Clock) -> None:
    bucket = BucketPolicy(rate=1, capacity=100, near_limit_after=120)

    async def minute(calls: int) -> int:
        alerts = 0
        for _ in range(calls):
            verdict = await backend.run(Admit("k", cost=1, amount=0, velocity=None, bucket=bucket))
            assert verdict.allowed and verdict.bucket is not None
            alerts += verdict.bucket.near_limit
            clock.advance(1)
        clock.advance(60 - calls)
        return alerts

    hot = [await minute(50) for _ in range(5)]  # 50 >= 80 % of 60 a minute
    assert hot == [0, 0, 1, 0, 0]  # after more than 2 minutes of it, once
    assert await minute(10) == 0  # a cool minute ends the episode
    assert [await minute(50) for _ in range(3)] == [0, 0, 1]


# -- status and live configuration -------------------------------------------------------------


async def test_status_of_an_unknown_key(backend: Backend) -> None:
    status = await backend.run(ReadStatus("nobody", OPEN, BucketPolicy(rate=2, capacity=5)))
    assert status == Status(key="nobody", bucket_capacity=5.0, bucket_rate=2.0)


async def test_status_reads_without_changing(backend: Backend, clock: Clock) -> None:
    bucket = BucketPolicy(rate=2, capacity=5)
    await backend.run(Admit("k", cost=3, amount=40, velocity=CEILING, bucket=bucket))
    clock.advance(0.5)
    for _ in range(3):
        status = await backend.run(ReadStatus("k", CEILING, bucket))
        assert (status.rate, status.samples) == (40.0, 0)
        assert status.first_seen == clock.now - 0.5
        assert (status.established, status.limit) == (False, 1000.0)
        assert (status.bucket_level, status.bucket_capacity, status.bucket_rate) == (3.0, 5.0, 2.0)


async def test_a_live_limit_wins_over_the_policy_and_can_be_cleared(
    backend: Backend, clock: Clock
) -> None:
    await backend.run(Configure("k", limit=100.0))
    status = await backend.run(ReadStatus("k", OPEN, None))
    assert (status.limit, status.first_seen) == (100.0, clock.now)
    trip = await backend.run(Record("k", 150, OPEN))
    assert (trip.reason, trip.limit) == ("manual_ceiling", 100.0)

    await backend.run(Configure("k", limit=None))
    await backend.run(Reset("k"))
    assert (await backend.run(Record("k", 150, OPEN))).allowed


async def test_live_bucket_settings(backend: Backend, clock: Clock) -> None:
    bucket = BucketPolicy(rate=1, capacity=2)
    await backend.run(Configure("k", capacity=5.0))
    passed = [
        (await backend.run(Admit("k", cost=1, amount=0, velocity=None, bucket=bucket))).allowed
        for _ in range(6)
    ]
    assert passed == [True] * 5 + [False]
    await backend.run(Configure("k", rate=10.0))
    clock.advance(0.3)
    verdict = await backend.run(Admit("k", cost=3, amount=0, velocity=None, bucket=bucket))
    assert verdict.bucket is not None
    assert (verdict.allowed, verdict.bucket.rate, verdict.bucket.capacity) == (True, 10.0, 5.0)
    await backend.run(Configure("k", capacity=None, rate=None))
    status = await backend.run(ReadStatus("k", OPEN, bucket))
    assert (status.bucket_capacity, status.bucket_rate) == (2.0, 1.0)


async def test_reset_refills_the_bucket(backend: Backend) -> None:
    bucket = BucketPolicy(rate=0.001, capacity=2)
    for _ in range(2):
        await backend.run(Admit("k", cost=1, amount=0, velocity=None, bucket=bucket))
    assert not (
        await backend.run(Admit("k", cost=1, amount=0, velocity=None, bucket=bucket))
    ).allowed
    await backend.run(Reset("k"))
    assert (await backend.run(ReadStatus("k", OPEN, bucket))).bucket_level == 2.0


async def test_keys_are_independent(backend: Backend) -> None:
    await backend.run(Record("a", 2000, CEILING))
    assert not (await backend.run(Gate("a"))).allowed
    assert (await backend.run(Gate("b"))).allowed


@pytest.mark.parametrize("amount", [1e-9, 0.1, 3, 2**40, 1e15])
async def test_amounts_of_any_size_are_counted_exactly(backend: Backend, amount: float) -> None:
    assert (await backend.run(Record("k", amount, OPEN))).rate == float(amount)
    assert (await backend.run(Record("k", amount, OPEN))).rate == float(amount) + float(amount)


# -- Redis: what only a shared server can show -----------------------------------------------------


async def test_overrides_are_seen_by_another_process(redis_backend: Backend) -> None:
    other = redis_backend.twin()
    await redis_backend.run(Configure("k", limit=100.0, capacity=1.0))
    trip = await other.run(Record("k", 150, OPEN))
    assert (trip.reason, trip.limit) == ("manual_ceiling", 100.0)
    assert not (await redis_backend.run(Gate("k"))).allowed  # and the trip is seen back
    bucket = BucketPolicy(rate=0.001, capacity=50)
    verdicts = [await other.run(Admit("b", cost=1, amount=0, velocity=None, bucket=bucket))]
    await redis_backend.run(Configure("b", capacity=1.0))  # 49 left, but the bucket holds 1 now
    for _ in range(2):
        verdicts.append(await other.run(Admit("b", cost=1, amount=0, velocity=None, bucket=bucket)))
    assert [v.allowed for v in verdicts] == [True, True, False]


async def test_every_write_sets_the_ttl(redis_backend: Backend) -> None:
    raw = redis_backend.raw
    assert raw is not None
    bucket = BucketPolicy(rate=1, capacity=5)
    writes = [
        redis_backend.run(Record("r", 1, OPEN)),
        redis_backend.run(Admit("a", cost=1, amount=1, velocity=OPEN, bucket=bucket)),
        redis_backend.run(Configure("c", limit=5.0, rate=2.0)),
        redis_backend.run(Admit("b", cost=1, amount=1, velocity=None, bucket=bucket)),
    ]
    for write in writes:
        await write
    for key in ("r", "a", "c", "b"):
        assert 14 * 86_400_000 - 60_000 < raw.pttl(redis_backend.key(key)) <= 14 * 86_400_000
    raw.pexpire(redis_backend.key("a"), 10_000)
    await redis_backend.run(Reset("a"))
    assert raw.pttl(redis_backend.key("a")) > 10_000
    # one string per identity: velocity block (704 bytes) and/or bucket block (64 bytes)
    sizes = [raw.strlen(redis_backend.key(key)) for key in ("r", "a", "c", "b")]
    assert sizes == [704, 768, 768, 64]


@pytest.mark.parametrize("kind", ["redis-sync", "redis-async", "fakeredis"])
async def test_scripts_are_reloaded_after_script_flush(
    kind: str, request: pytest.FixtureRequest, clock: Clock
) -> None:
    """SCRIPT FLUSH empties the script cache of every client of a server: it runs on a
    redis-server of the test's own (fakeredis: a server of its own anyway)."""
    url = None if kind == "fakeredis" else request.getfixturevalue("own_redis").url
    backend = await open_backend(kind, request, clock, url)
    try:
        assert backend.raw is not None
        await backend.run(Record("k", 600, CEILING))
        backend.raw.script_flush()
        assert (await backend.run(Record("k", 600, CEILING))).tripped
        backend.raw.script_flush()
        assert not (await backend.run(Gate("k"))).allowed
    finally:
        await close_backend(backend)


async def test_an_identity_is_one_key_with_a_hash_tag(redis_backend: Backend) -> None:
    from redis.crc import key_slot

    for key in ("default:0f3a", "inbound:" + "e" * 32, "x"):
        name = redis_backend.key(key)
        assert name == f"{redis_backend.prefix}:{{{key}}}"
        assert key_slot(name.encode()) == key_slot(key.encode())
    for key in ("a}b", "{weird}"):
        name = redis_backend.key(key)
        assert name.startswith(f"{redis_backend.prefix}:{{") and name.endswith("}")


async def test_state_size_is_constant_whatever_the_traffic(
    redis_backend: Backend, clock: Clock
) -> None:
    raw = redis_backend.raw
    assert raw is not None
    bucket = BucketPolicy(rate=1000, capacity=1000)
    await redis_backend.run(Configure("k", limit=1e9, capacity=1000.0, rate=1000.0))
    sizes = []
    for calls in (1, 600):
        for n in range(calls):
            clock.advance(0.1 + (n % 7) * 3.3)
            amount = n * 1.7 + 0.1
            await redis_backend.run(Admit("k", cost=1, amount=amount, velocity=OPEN, bucket=bucket))
        name = redis_backend.key("k")
        size = [raw.type(name), raw.strlen(name)]
        if redis_backend.kind != "fakeredis":  # fakeredis has no MEMORY USAGE
            size.append(raw.memory_usage(name) or 0)
        sizes.append(size)
    assert sizes[0] == sizes[1]
    assert sizes[0][:2] == [b"string", (87 + 1 + 6 + 2) * 8]
    if redis_backend.kind != "fakeredis":
        assert sizes[0][-1] < 2048


@pytest.mark.redis
def test_the_server_clock_is_the_default(redis_url: str) -> None:
    import time

    import redis

    from tests.stores.conftest import delete_prefix, unique_prefix
    from tokenfuse._stores.redis import RedisStore

    client = redis.Redis.from_url(redis_url)
    store = RedisStore(client, prefix=unique_prefix())
    try:
        before = time.time()
        store.run(Record("k", 600, CEILING))
        trip = store.run(Record("k", 600, CEILING))
        status = store.run(ReadStatus("k", CEILING, None))
        assert before - 1 <= status.first_seen <= time.time() + 1
        assert trip.tripped
        assert 29 < store.run(Gate("k")).retry_after <= 30
        bucket = BucketPolicy(rate=1, capacity=1)
        assert store.run(Admit("b", cost=1, amount=0, velocity=None, bucket=bucket)).allowed
        assert not store.run(Admit("b", cost=1, amount=0, velocity=None, bucket=bucket)).allowed
    finally:
        delete_prefix(client, store.prefix)
        client.close()
