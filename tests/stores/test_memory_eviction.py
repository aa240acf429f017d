"""MemoryStore under a flood of made-up identities: what matters is evicted last, and counted.

A full table evicts the least recently used entry *without live state*; an open key, a live
override and a drained bucket survive any number of ordinary newcomers. Only a table full of
live state gives one up, and that eviction is counted and logged.
"""

from __future__ import annotations

import logging

import pytest

from tests.conftest import Clock
from tokenfuse import BucketPolicy, Fuse, FuseTripped, MemoryStore, VelocityPolicy
from tokenfuse.fuse import Identity

BUCKET = BucketPolicy(rate=1, capacity=50)
FLOOD = 20_000  # twenty times the table: every ordinary entry is evicted many times over


def flood(fuse: Fuse, count: int = FLOOD) -> None:
    for n in range(count):
        fuse.admit(Identity.secret(f"invented-api-key-{n:08d}"))


@pytest.fixture
def fuse(clock: Clock) -> Fuse:
    store = MemoryStore(max_keys=1_000, clock=clock)
    return Fuse(store, velocity=VelocityPolicy(limit=1_000), bucket=BUCKET)


def test_a_flood_keeps_the_table_at_its_bound(fuse: Fuse) -> None:
    flood(fuse)

    assert isinstance(fuse.store, MemoryStore)
    assert len(fuse.store) == 1_000
    assert fuse.store.evictions == FLOOD - 1_000
    assert fuse.store.live_evictions == 0


def test_a_drained_bucket_survives_a_flood(fuse: Fuse) -> None:
    for _ in range(50):
        assert fuse.admit("legit-caller").allowed
    assert not fuse.admit("legit-caller").allowed

    flood(fuse)

    assert not fuse.admit("legit-caller").allowed  # not handed a fresh bucket of 50


def test_an_open_key_survives_a_flood(fuse: Fuse) -> None:
    fuse.record("looping-agent", 5_000)  # over the 1,000/min ceiling: trips
    assert not fuse.gate("looping-agent").allowed

    flood(fuse)

    refusal = fuse.gate("looping-agent").error
    assert isinstance(refusal, FuseTripped)


def test_a_live_limit_survives_a_flood(fuse: Fuse) -> None:
    fuse.set_limit("capped-agent", 10)
    fuse.admit("capped-agent")  # used once, then forgotten by the flood's recency

    flood(fuse)

    assert fuse.status("capped-agent").limit == 10


def test_a_bucket_that_refilled_is_ordinary_again(fuse: Fuse, clock: Clock) -> None:
    for _ in range(50):
        fuse.admit("legit-caller")
    clock.advance(60)  # refilled past half at 1/s

    flood(fuse)

    assert fuse.status("legit-caller").bucket_level is None  # evicted: nothing to keep


def test_a_table_full_of_live_state_evicts_anyway_counted_and_logged(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore(max_keys=10, clock=clock)
    fuse = Fuse(store, velocity=VelocityPolicy(limit=10))
    for n in range(10):
        fuse.record(f"tripped-{n}", 100)  # each one open

    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        fuse.record("newcomer", 1)  # no room but live state: one open key goes
        assert store.live_evictions == 1
        assert fuse.status("newcomer").rate == 1  # never the entry that room is made for
        fuse.record("another", 1)  # now the ordinary newcomer goes first
        fuse.record("and-another", 1)

    assert len(store) == 10
    assert store.live_evictions == 1
    assert store.evictions == 3
    assert [r.getMessage() for r in caplog.records if "full of live" in r.getMessage()] == [
        "tokenfuse MemoryStore is full of live state (10 keys, all of the 10 oldest open, "
        "overridden or drained): evicted one anyway, 1 so far; raise max_keys"
    ]


def test_live_eviction_warnings_are_rate_limited(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore(max_keys=2, clock=clock)
    fuse = Fuse(store, velocity=VelocityPolicy(limit=10))
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        for n in range(5):
            fuse.record(f"tripped-{n}", 100)
        clock.advance(61)
        fuse.set_limit("overridden", 5)  # live too; the open keys have closed by now

    assert store.live_evictions == 3
    warnings = [r for r in caplog.records if "full of live state" in r.getMessage()]
    assert len(warnings) == 1  # at most one a minute; the count keeps every one


def test_a_one_key_table_keeps_the_newcomer(clock: Clock) -> None:
    store = MemoryStore(max_keys=1, clock=clock)
    fuse = Fuse(store, velocity=VelocityPolicy(limit=10))
    fuse.record("tripped", 100)

    fuse.record("newcomer", 1)

    assert fuse.status("newcomer").rate == 1
    assert store.live_evictions == 1
