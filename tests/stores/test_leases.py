"""Leases (``tokenfuse._leases``, ``_core/lease.py``) on every backend, on the simulated clock.

Each test runs through the face the backend serves (``admit`` or ``aadmit``); a second
``Leases`` over another store of the same backend stands for another process.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from typing import Any

import pytest

from tests.conftest import Clock
from tests.stores.conftest import Backend
from tokenfuse import BucketPolicy, Fuse, VelocityPolicy
from tokenfuse._core.lease import LeasePolicy
from tokenfuse._errors import ConfigurationError, StoreUnavailable
from tokenfuse._fuse import Decision
from tokenfuse._identity import Identity
from tokenfuse._leases import Leases
from tokenfuse._stores.memory import MemoryStore
from tokenfuse._stores.ops import Lease, ReadStatus

SECRET = "a test secret of at least 16 characters"
BUCKET = BucketPolicy(rate=10, capacity=100)
CALLS = VelocityPolicy(limit=1_000_000, unit="calls", cold_start_limit=None)


def on_demand(**options: Any) -> LeasePolicy:
    """A policy whose leases are renewed only when they run out: exact round-trip counts
    whatever the face (asyncio callers top leases up in the background otherwise)."""
    return LeasePolicy(top_up=False, **options)


def fuse_on(store: Any, bucket: BucketPolicy = BUCKET, **options: Any) -> Fuse:
    return Fuse(store, name="in", velocity=CALLS, bucket=bucket, secret=SECRET, **options)


def leases_on(backend: Backend, policy: LeasePolicy, store: Any = None, **options: Any) -> Leases:
    fuse = fuse_on(store if store is not None else backend.store, **options)
    return Leases(fuse, policy, clock=backend.clock, background=False)


async def admit(backend: Backend, leases: Leases, who: str = "agent", **kwargs: Any) -> Decision:
    if backend.is_async:
        return await leases.aadmit(who, **kwargs)
    return leases.admit(who, **kwargs)


async def sweep(backend: Backend, leases: Leases, everything: bool = False) -> int:
    if backend.is_async:
        return await leases.asweep(everything=everything)
    return leases.sweep(everything=everything)


async def level(backend: Backend, fuse: Fuse, who: str = "agent") -> float:
    status = await fuse.astatus(who) if backend.is_async else fuse.status(who)
    assert status.bucket_level is not None
    return status.bucket_level


async def test_a_lease_admits_locally_until_spent(backend: Backend) -> None:
    leases = leases_on(backend, on_demand(size=10))
    decisions = [await admit(backend, leases) for _ in range(11)]
    assert all(d.allowed for d in decisions)
    # The first call took its cost and ten more; the next ten were local; none asked twice.
    assert (leases.counts.renewals, leases.counts.local) == (1, 10)
    assert await level(backend, leases.fuse) == 100 - 11
    assert (await admit(backend, leases)).allowed
    assert leases.counts.renewals == 2  # the twelfth renewed it


async def test_a_local_decision_carries_the_bucket_for_the_headers(backend: Backend) -> None:
    leases = leases_on(backend, on_demand(size=10))
    await admit(backend, leases)
    local = await admit(backend, leases)
    assert local.bucket is not None
    # What the bucket held after the grant (89) plus what this process still holds (9).
    assert (local.bucket.remaining, local.bucket.capacity, local.bucket.rate) == (98, 100, 10)
    assert local.key_id == leases.fuse.key_id("agent")


async def test_unspent_tokens_go_back_when_the_lease_expires(
    backend: Backend, clock: Clock
) -> None:
    leases = leases_on(backend, on_demand(size=20, lifetime=1.0))
    for _ in range(5):
        await admit(backend, leases)
    assert await level(backend, leases.fuse) == 100 - 21
    clock.advance(0.5)
    assert await sweep(backend, leases) == 0  # not expired yet
    clock.advance(0.5)
    assert await sweep(backend, leases) == 1
    assert leases.counts.returned == 16
    # 5 spent, 16 back, 10/s refilled for one second, never above the capacity.
    assert await level(backend, leases.fuse) == 100.0
    assert await sweep(backend, leases) == 0  # given back once


async def test_an_expired_lease_is_not_spent_and_goes_back_at_renewal(
    backend: Backend, clock: Clock
) -> None:
    slow = BucketPolicy(rate=0.001, capacity=100)
    leases = leases_on(backend, on_demand(size=20, lifetime=1.0), bucket=slow)
    await admit(backend, leases)
    clock.advance(1.0)
    await admit(backend, leases)  # the old lease's 20 go back with this renewal
    assert leases.counts.renewals == 2
    # 2 spent, 20 of the second lease held; the first lease's 20 came back.
    assert await level(backend, leases.fuse) == pytest.approx(100 - 2 - 20, abs=0.01)


async def test_closing_gives_every_lease_back(backend: Backend) -> None:
    leases = leases_on(backend, on_demand(size=30))
    for who in ("a", "b", "c"):
        await admit(backend, leases, who)
    if backend.is_async:
        await leases.aclose()
    else:
        leases.close()
    assert leases.counts.returns == 3
    for who in ("a", "b", "c"):
        assert await level(backend, leases.fuse, who) == 99


async def test_an_adaptive_lease_follows_the_callers_rate(backend: Backend, clock: Clock) -> None:
    leases = leases_on(backend, on_demand(cover=0.1, max_size=50), bucket=BucketPolicy(
        rate=10_000, capacity=10_000
    ))  # fmt: skip
    asked: list[float] = []
    store = leases.fuse.store
    run = store.arun if backend.is_async else store.run

    if backend.is_async:

        async def spy(op: Any) -> Any:
            if isinstance(op, Lease):
                asked.append(op.want)
            return await run(op)

        leases.fuse._async_store = type("Spy", (), {"arun": staticmethod(spy)})()
    else:

        def sspy(op: Any) -> Any:
            if isinstance(op, Lease):
                asked.append(op.want)
            return run(op)

        leases.fuse._sync_store = type("Spy", (), {"run": staticmethod(sspy)})()
    for _ in range(2_000):  # 1,000 calls a second
        await admit(backend, leases)
        clock.advance(0.001)
    assert asked[0] == 1.0  # a first lease knows no rate
    assert max(asked) == 50  # 0.1 s of 1,000/s is 100: capped at max_size
    assert leases.counts.renewals < 2_000 / 40


async def test_another_tier_renews_the_lease(backend: Backend) -> None:
    leases = leases_on(backend, on_demand(size=10))
    gold = BucketPolicy(rate=10, capacity=1_000)
    await admit(backend, leases)
    moved = await admit(backend, leases, bucket=gold)
    assert leases.counts.renewals == 2
    assert moved.bucket is not None and moved.bucket.capacity == 1_000


async def test_a_live_bucket_change_through_the_fuse_renews_the_lease(backend: Backend) -> None:
    leases = leases_on(backend, on_demand(size=10))
    await admit(backend, leases)
    if backend.is_async:
        await leases.fuse.aset_bucket("agent", capacity=5)
    else:
        leases.fuse.set_bucket("agent", capacity=5)
    changed = await admit(backend, leases)
    assert leases.counts.renewals == 2
    assert changed.bucket is not None and changed.bucket.capacity == 5


async def test_a_refusal_is_answered_locally_within_its_retry_after(
    backend: Backend, clock: Clock
) -> None:
    leases = leases_on(backend, on_demand(size=4), bucket=BucketPolicy(rate=1, capacity=5))
    allowed = [(await admit(backend, leases)).allowed for _ in range(7)]
    assert allowed == [True] * 5 + [False] * 2
    assert (leases.counts.renewals, leases.counts.refused_locally) == (2, 1)
    clock.advance(1.0)  # one token refilled: retry_after has passed
    assert (await admit(backend, leases)).allowed
    assert leases.counts.renewals == 3


async def test_calls_admitted_locally_reach_the_velocity_window(backend: Backend) -> None:
    leases = leases_on(backend, on_demand(size=10))
    for _ in range(6):
        await admit(backend, leases)
    await sweep(backend, leases, everything=True)
    status = await leases.fuse.astatus("agent") if backend.is_async else leases.fuse.status("agent")
    assert status.rate == 6


async def test_a_trip_by_locally_admitted_calls_refuses_at_the_next_renewal(
    backend: Backend,
) -> None:
    tight = VelocityPolicy(limit=5, unit="calls", cooldown=30)
    fuse = Fuse(backend.store, name="in", velocity=tight, bucket=BUCKET, secret=SECRET)
    tripped: list[str] = []
    fuse.on_event(lambda event: tripped.append(event.kind))
    leases = Leases(fuse, on_demand(size=10), clock=backend.clock, background=False)
    decisions = [await admit(backend, leases) for _ in range(12)]
    # The lease admitted 11 calls before the store heard of them; the renewal that records
    # them trips the key (an event) and refuses; the refusal is then answered locally.
    assert [d.allowed for d in decisions] == [True] * 11 + [False]
    assert "tripped" in tripped
    assert decisions[-1].error is not None and decisions[-1].error.reason == "manual_ceiling"
    assert (await admit(backend, leases)).allowed is False
    assert leases.counts.refused_locally == 1


async def test_over_admission_stays_within_the_stated_bound(backend: Backend, clock: Clock) -> None:
    """Several processes spend one bucket at random: in every interval, what they admitted
    costs at most capacity + rate * T + processes * largest lease. (Without leases, the last
    term is 0; the check below fails if a lease can spend what it was not granted.)"""
    processes = 4 if backend.kind == "memory" else 2  # Redis: the same core, fewer clients
    bucket = BUSY
    policy = LeasePolicy(max_size=8, lifetime=5)  # top-ups too, with the asyncio client
    # A MemoryStore is one table for every "process"; a Redis twin is another client.
    twin = (lambda: None) if backend.kind == "memory" else (lambda: backend.twin().store)
    group = [
        leases_on(backend, policy, store=twin() if at else None, bucket=bucket)
        for at in range(processes)
    ]
    chance = random.Random(processes)
    admitted: list[tuple[float, float]] = []
    for _ in range(1_200):
        clock.advance(pause(chance))
        cost = chance.choice([1.0, 1.0, 2.0])
        if (await admit(backend, chance.choice(group), cost=cost)).allowed:
            admitted.append((clock.now, cost))
        if chance.random() < 0.01:
            await sweep(backend, chance.choice(group))
    assert worst_excess(admitted, bucket) <= policy.bound(processes) + 1e-6
    assert len(admitted) > 100  # the bucket was spent, not refused throughout
    assert sum(leases.counts.local for leases in group) > 0


# The store's failure is the fuse's whatever the store (the real Redis going away:
# tests/drills/test_lease_drill.py): a MemoryStore that raises stands for any.


async def test_a_failing_store_fails_open_like_the_direct_mode(clock: Clock) -> None:
    backend = Backend("memory", None, False, clock)
    broken = _Broken(MemoryStore(clock=clock))
    leases = leases_on(backend, on_demand(size=5), store=broken)
    assert (await admit(backend, leases)).allowed  # a lease of 5 more
    broken.down = True
    local = [await admit(backend, leases) for _ in range(5)]
    assert all(d.allowed and not d.degraded for d in local)  # the lease was granted
    failed = await admit(backend, leases)
    assert failed.allowed and failed.degraded
    assert leases.fuse.health.counts.failed == 1
    broken.down = False
    assert (await admit(backend, leases)).allowed
    # The five calls admitted while the store was down reach it with the next renewal.
    status = leases.fuse.status("agent")
    assert status.rate == 7


async def test_a_failing_store_fails_closed_when_configured(clock: Clock) -> None:
    backend = Backend("memory", None, False, clock)
    broken = _Broken(MemoryStore(clock=clock))
    broken.down = True
    leases = leases_on(backend, on_demand(size=5), store=broken, fail_closed=True)
    with pytest.raises(StoreUnavailable):
        await admit(backend, leases)
    assert all(slot.renewing is None for slot in leases._slots.values())  # nobody waits on it
    broken.down = False
    assert (await admit(backend, leases)).allowed


def test_lease_policies_refuse_nonsense() -> None:
    for bad in ({"size": 0}, {"max_size": -1}, {"lifetime": float("nan")}, {"max_keys": 0}):
        with pytest.raises(ConfigurationError):
            LeasePolicy(**bad)
    assert LeasePolicy().bound(4) == 400
    assert LeasePolicy(size=25).bound(3) == 75


#: The bound tests' bucket: refilled in two seconds, while a lease lives five, so that tokens
#: held through a refill show up as calls beyond capacity + rate * T.
BUSY = BucketPolicy(rate=20, capacity=40)


def pause(chance: random.Random) -> float:
    """Bursts of calls, now and then an idle spell in which the bucket refills."""
    if chance.random() < 0.01:
        return 2.5
    return chance.choice([0.0, 0.0005, 0.002, 0.01, 0.05])


def worst_excess(admitted: list[tuple[float, float]], bucket: BucketPolicy) -> float:
    """The most that the calls admitted in any interval cost beyond capacity + rate * T."""
    spent = list(itertools.accumulate(cost for _, cost in admitted))
    worst = 0.0
    for i, (start, _) in enumerate(admitted):
        before = spent[i - 1] if i else 0.0
        for j in range(i, len(admitted)):
            allowance = bucket.capacity + bucket.rate * (admitted[j][0] - start)
            worst = max(worst, spent[j] - before - allowance)
    return worst


class _Broken:
    """A store that raises ``StoreUnavailable`` while ``down``."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.down = False

    def run(self, op: Any) -> Any:
        if self.down:
            raise StoreUnavailable("down for the test")
        return self.store.run(op)

    async def arun(self, op: Any) -> Any:
        return self.run(op)

    def run_many(self, ops: Any) -> list[Any]:
        return [self.run(op) for op in ops]


async def test_another_processes_live_change_is_seen_within_a_lifetime(
    backend: Backend, clock: Clock
) -> None:
    leases = leases_on(backend, on_demand(size=10, lifetime=1.0))
    view = getattr(backend.store, "open_keys", None)
    if view is not None:  # this process hears no announcement (a subscription lost)
        view.listeners.clear()
    other = fuse_on(backend.store if backend.kind == "memory" else backend.twin().store)
    await admit(backend, leases)
    if backend.is_async:
        await other.aset_bucket("agent", capacity=5)
    else:
        other.set_bucket("agent", capacity=5)
    stale = await admit(backend, leases)  # this process has not heard of it: its lease holds
    assert stale.bucket is not None and stale.bucket.capacity == 100
    clock.advance(1.0)  # the lease expired: the renewal reads the change
    fresh = await admit(backend, leases)
    assert fresh.bucket is not None and fresh.bucket.capacity == 5


# -- concurrency: one call renews, the others wait for it at most LeasePolicy.wait ----------------


class _Held(MemoryStore):
    """A MemoryStore whose ``Lease`` waits until the test lets it go: a renewal in flight."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.admits = 0

    def run(self, op: Any) -> Any:
        if isinstance(op, Lease) and not self.release.is_set():
            self.entered.set()
            self.release.wait(10)
        if type(op).__name__ == "Admit":
            self.admits += 1
        return super().run(op)


def test_a_call_waits_for_a_renewal_at_most_wait_then_goes_direct(clock: Clock) -> None:
    store = _Held(clock=clock)
    leases = Leases(fuse_on(store), on_demand(size=10, wait=0.01), clock=clock, background=False)
    renewing = threading.Thread(target=leases.admit, args=("agent",))
    renewing.start()
    assert store.entered.wait(10)
    decision = leases.admit("agent")  # the renewal is held: this one cannot wait for ever
    assert decision.allowed and decision.bucket is not None
    assert (leases.counts.direct, store.admits) == (1, 1)
    store.release.set()
    renewing.join(10)
    assert leases.admit("agent").allowed
    assert (leases.counts.renewals, leases.counts.local) == (1, 1)


def test_a_call_that_waited_spends_the_new_lease(clock: Clock) -> None:
    store = _Held(clock=clock)
    leases = Leases(fuse_on(store), on_demand(size=10, wait=10), clock=clock, background=False)
    renewing = threading.Thread(target=leases.admit, args=("agent",))
    renewing.start()
    assert store.entered.wait(10)
    waiting: list[Decision] = []
    waiter = threading.Thread(target=lambda: waiting.append(leases.admit("agent")))
    waiter.start()
    store.release.set()  # the waiter wakes when the renewal is in, whenever that is
    renewing.join(10)
    waiter.join(10)
    assert waiting[0].allowed
    assert (leases.counts.renewals, leases.counts.local, leases.counts.direct) == (1, 1, 0)


async def test_concurrent_async_calls_share_one_renewal(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    slow_runs: list[str] = []

    class Slow:
        async def arun(self, op: Any) -> Any:
            slow_runs.append(op.name)
            await asyncio.sleep(0)  # the others get to run while this renewal is in flight
            return store.run(op)

    fuse = fuse_on(Slow())
    leases = Leases(fuse, on_demand(size=10, wait=10), clock=clock, background=False)
    decisions = await asyncio.gather(*(leases.aadmit("agent") for _ in range(8)))
    assert all(d.allowed for d in decisions)
    assert slow_runs == ["lease"]  # one round trip for eight calls
    assert (leases.counts.renewals, leases.counts.local) == (1, 7)


def test_callers_beyond_max_keys_are_decided_directly(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    leases = Leases(fuse_on(store), on_demand(size=10, max_keys=2), clock=clock, background=False)
    for who in ("a", "b", "c", "c"):
        assert leases.admit(who).allowed
    assert (len(leases._slots), leases.counts.direct) == (2, 2)
    leases.sweep(everything=True)  # the table empties as leases go back
    assert len(leases._slots) == 0


# -- announcements: what another process does reaches this one's leases in milliseconds ------


@pytest.mark.redis
@pytest.mark.parametrize("change", ["set_bucket", "trip", "reset"])
def test_another_processes_change_renews_the_lease_when_announced(
    redis_url: str, redis_prefix: str, clock: Clock, change: str
) -> None:
    from tokenfuse._stores.redis import RedisStore

    here = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock)
    there = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock)
    tight = VelocityPolicy(limit=100, unit="calls", cooldown=30)
    fuse = Fuse(here, name="in", velocity=tight, bucket=BUCKET, secret=SECRET)
    other = Fuse(there, name="in", velocity=tight, bucket=BUCKET, secret=SECRET)
    leases = Leases(fuse, on_demand(size=10, lifetime=3_600), clock=clock, background=False)
    try:
        assert here.open_keys is not None and here.open_keys.wait_synced(10)
        assert leases.admit("agent").allowed  # a lease of 10 more, for an hour
        if change == "set_bucket":
            other.set_bucket("agent", capacity=5)
        elif change == "trip":
            assert other.record("agent", 500).tripped
        else:
            other.reset("agent")
        key = fuse._key(Identity.of("agent"))

        def renewed(_: Any) -> bool:
            lease = leases._slots[key].lease
            return lease is None or lease.expires == float("-inf")

        assert here.open_keys.wait_until(renewed, 10)  # the announcement arrived
        decision = leases.admit("agent")
        assert leases.counts.renewals == 2
        if change == "set_bucket":
            assert decision.bucket is not None and decision.bucket.capacity == 5
        elif change == "trip":
            assert not decision.allowed and decision.error is not None
        else:
            assert decision.allowed and decision.bucket is not None
            assert decision.bucket.remaining == 100 - 1 - 10  # refilled by the reset
    finally:
        here.close()
        there.close()


def test_a_trip_recorded_in_this_process_renews_the_lease(clock: Clock) -> None:
    """count="tokens": calls are admitted with amount 0 and the handler's tokens recorded
    after; a record that trips the key renews the lease, so the next call is refused."""
    tight = VelocityPolicy(limit=1_000, cooldown=30)
    fuse = Fuse(MemoryStore(clock=clock), velocity=tight, bucket=BUCKET, secret=SECRET)
    leases = Leases(fuse, on_demand(size=10, lifetime=60), clock=clock, background=False)
    assert leases.admit("agent", amount=0).allowed
    assert fuse.record("agent", 5_000).tripped
    refused = leases.admit("agent", amount=0)
    assert not refused.allowed and refused.error is not None
    assert leases.counts.renewals == 2


# -- top-ups: asyncio callers refill a half-spent lease in the background ------------------------


async def test_an_asyncio_caller_tops_its_lease_up_off_the_callers_path(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    leases = Leases(fuse_on(store), LeasePolicy(size=10), clock=clock, background=False)
    for _ in range(9):  # the first takes 1 + 10; eight spent leave 2, under a quarter
        assert (await leases.aadmit("agent")).allowed
    assert len(leases._tasks) == 1  # scheduled; the call did not wait for it
    await asyncio.gather(*leases._tasks)
    assert leases.counts.top_ups == 1
    lease = leases._slots[leases.fuse._key(Identity.of("agent"))].lease
    assert lease is not None and lease.tokens == 10  # 2 + 8: never more than the size
    assert store.run(ReadStatus(leases.fuse._key(Identity.of("agent")), CALLS, BUCKET)).rate == 9
    for _ in range(20):
        assert (await leases.aadmit("agent")).allowed
    await asyncio.gather(*leases._tasks)
    # 29 calls: one renewal on demand, the rest from leases topped up in the background.
    assert (leases.counts.renewals, leases.counts.local) == (1, 28)


async def test_a_top_up_for_a_lease_invalidated_meanwhile_goes_back(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    fuse = fuse_on(store)
    leases = Leases(fuse, LeasePolicy(size=10), clock=clock, background=False)
    for _ in range(9):
        await leases.aadmit("agent")
    fuse.set_bucket("agent", capacity=200)  # renews the lease at the next call
    await asyncio.gather(*leases._tasks)
    assert (leases.counts.returns, leases.counts.returned) == (1, 8)
    assert fuse.status("agent").bucket_level == 100 - 11 - 8 + 8  # the grant came back


async def test_a_top_up_that_finds_the_latch_open_ends_the_lease(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    tight = VelocityPolicy(limit=1_000, cooldown=30)
    fuse = Fuse(store, name="in", velocity=tight, bucket=BUCKET, secret=SECRET)
    leases = Leases(fuse, LeasePolicy(size=10), clock=clock, background=False)
    assert (await leases.aadmit("agent", amount=0)).allowed
    other = Fuse(store, name="in", velocity=tight, bucket=BUCKET, secret=SECRET)
    assert other.record("agent", 5_000).tripped  # another process, unheard of here
    for _ in range(8):  # still from the lease, until the top-up learns of the trip
        assert (await leases.aadmit("agent", amount=0)).allowed
    await asyncio.gather(*leases._tasks)
    refused = await leases.aadmit("agent", amount=0)
    assert not refused.allowed and refused.error is not None
    assert (leases.counts.top_ups, leases.counts.renewals) == (1, 1)  # refused from the top-up


async def test_top_ups_keep_the_bound_with_asyncio_callers(clock: Clock) -> None:
    """The bound test's random spending, by asyncio callers whose top-ups run between them."""
    store = MemoryStore(clock=clock)
    bucket = BUSY
    policy = LeasePolicy(max_size=8, lifetime=5)
    group = [
        Leases(fuse_on(store, bucket=bucket), policy, clock=clock, background=False)
        for _ in range(4)
    ]
    chance = random.Random(7)
    admitted: list[tuple[float, float]] = []
    for _ in range(1_500):
        clock.advance(pause(chance))
        cost = chance.choice([1.0, 1.0, 2.0])
        if (await chance.choice(group).aadmit("agent", cost=cost)).allowed:
            admitted.append((clock.now, cost))
        if chance.random() < 0.3:
            await asyncio.sleep(0)  # a top-up in flight gets to land
    assert sum(leases.counts.top_ups for leases in group) > 10
    assert worst_excess(admitted, bucket) <= policy.bound(4) + 1e-6


def test_a_renewal_abandoned_by_its_event_loop_does_not_block_the_caller(clock: Clock) -> None:
    """A task renewing a lease whose event loop is closed under it never finishes: after
    ``ABANDONED`` seconds, another call renews."""
    from tokenfuse._leases import ABANDONED

    leases = Leases(fuse_on(MemoryStore(clock=clock)), on_demand(size=10, wait=0.0), clock=clock,
                    background=False)  # fmt: skip
    loop = asyncio.new_event_loop()
    leases.admit("agent")
    slot = leases._slots[leases.fuse._key(Identity.of("agent"))]
    slot.lease = None
    slot.renewing, slot.renewing_since = loop.create_future(), clock.now
    loop.close()
    assert leases.admit("agent").allowed and leases.counts.direct == 1
    clock.advance(ABANDONED)
    assert leases.admit("agent").allowed
    assert (leases.counts.renewals, leases.counts.direct) == (2, 1)


# -- the sweeper: expired leases go back with nobody calling ----------------------------------


async def test_the_sweeper_gives_expired_leases_back(backend: Backend, clock: Clock) -> None:
    """A thread (a store with a sync face) or a task (asyncio-only) wakes every half lifetime
    (10 ms here, real time) and gives back what expired on the lease clock."""
    fuse = fuse_on(backend.store)
    leases = Leases(fuse, on_demand(size=10, lifetime=0.02), clock=clock)
    try:
        await admit(backend, leases)
        clock.advance(0.02)  # expired on the lease clock; the sweeper's next wake returns it
        for _ in range(500):  # waiting for the background sweeper, at most 5 s
            if leases.counts.returns:
                break
            if backend.is_async:
                await asyncio.sleep(0.01)
            else:
                time.sleep(0.01)
        assert (leases.counts.returns, leases.counts.returned) == (1, 10)
        assert await level(backend, fuse) == pytest.approx(100 - 1 + 10 * 0.02)  # and refilled
    finally:
        if backend.is_async:
            await leases.aclose()
        else:
            leases.close()


@pytest.mark.parametrize("fail_closed", [False, True])
async def test_a_top_up_that_fails_is_counted_and_the_lease_runs_on(
    clock: Clock, fail_closed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    broken = _Broken(MemoryStore(clock=clock))
    fuse = fuse_on(broken, fail_closed=fail_closed)
    leases = Leases(fuse, LeasePolicy(size=10), clock=clock, background=False)
    assert (await leases.aadmit("agent")).allowed
    broken.down = True
    for _ in range(8):  # the eighth leaves 2 of 10: a top-up, which fails in the background
        assert (await leases.aadmit("agent")).allowed
    await asyncio.gather(*leases._tasks)  # nothing escapes the task
    assert fuse.health.counts.failed == 1
    assert "store_unavailable" in caplog.text
    assert [(await leases.aadmit("agent")).allowed for _ in range(2)] == [True, True]
    broken.down = False
    assert not (await leases.aadmit("agent")).degraded  # spent: renewed on demand
    # The amounts the failed top-up carried were kept: every call reached the window.
    assert fuse.status("agent").rate == 12
