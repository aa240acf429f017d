"""``Admin``: keys listed, addressed by key id, name or credential, and steered, on both stores.

A bare string is never taken as a credential, and a reference that could mean two keys is an
error that says what to pass instead.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.conftest import Clock
from tokenfuse import FREE, Fuse, MemoryStore, RedisStore, VelocityPolicy
from tokenfuse.admin import Admin, AmbiguousKey, KeyNotFound, KeyRef, LocalEvents, NotAvailable
from tokenfuse.fuse import Identity

SECRET = "sk-live-0123456789abcdefWXYZ"

Pair = tuple[Fuse, Fuse]  # outbound ("default") and inbound, on one store


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def fuses(request: pytest.FixtureRequest, clock: Clock) -> Iterator[Pair]:
    if request.param == "memory":
        store: object = MemoryStore(clock=clock)
    else:
        prefix = request.getfixturevalue("redis_prefix")
        store = RedisStore.from_url(
            request.getfixturevalue("redis_url"), prefix=prefix, clock=clock
        )
    outbound = Fuse(store, velocity=VelocityPolicy(limit=10_000))  # type: ignore[arg-type]
    inbound = Fuse(store, name="inbound", bucket=FREE)  # type: ignore[arg-type]
    yield outbound, inbound
    if isinstance(store, RedisStore):
        store.close()


@pytest.fixture
def admin(fuses: Pair) -> Iterator[Admin]:
    feed = LocalEvents()
    yield Admin(list(fuses), feed=feed, page_size=3)
    feed.close()


def test_keys_are_listed_with_their_state_and_sorted(admin: Admin, fuses: Pair) -> None:
    outbound, inbound = fuses
    for n in range(1, 8):
        outbound.record(f"agent-{n}", 1_000.0 * n)  # agent-7 is near its ceiling
    outbound.record(Identity.secret(SECRET), 12_000)  # trips
    inbound.admit("caller-1")
    views = admin.keys()
    assert len(views) == 9  # across pages of 3, both fuses
    assert [view.status.rate for view in views][:3] == [12_000.0, 7_000.0, 6_000.0]
    assert [view.state for view in views[:3]] == ["open", "ok", "ok"]
    assert admin.keys(sort="state")[0].label == "sk-…WXYZ"  # learned from the trip event
    assert {view.fuse for view in admin.keys(fuse="inbound")} == {"inbound"}
    (blocked,) = admin.blocked()
    assert blocked.key_id == outbound.key_id(Identity.secret(SECRET))
    assert blocked.threshold == 10_000.0
    outbound.record("agent-7", 1_500)  # 8,500 of 10,000: near
    assert admin.find("agent-7")[0].state == "near"


def test_a_key_is_found_by_key_id_name_or_credential(admin: Admin, fuses: Pair) -> None:
    outbound, _ = fuses
    outbound.record(Identity.secret(SECRET), 100)
    outbound.record("agent-1", 100)
    key_id = outbound.key_id(Identity.secret(SECRET))
    assert [view.key_id for view in admin.find(key_id)] == [key_id]
    assert [view.key_id for view in admin.find(key_id[:6])] == [key_id]  # a unique start will do
    assert admin.find(KeyRef.secret(SECRET))[0].label == "sk-…WXYZ"
    assert admin.find("agent-1")[0].label == "agent-1"
    assert admin.find(KeyRef.name("agent-1"))[0].status.rate == 100.0


def test_a_raw_credential_is_never_taken_as_a_name(admin: Admin, fuses: Pair) -> None:
    fuses[0].record(Identity.secret(SECRET), 100)
    with pytest.raises(AmbiguousKey, match="looks like a credential: pass it with --secret"):
        admin.reset(SECRET)
    with pytest.raises(KeyNotFound, match="redacted label"):
        admin.reset("sk-…WXYZ")
    with pytest.raises(KeyNotFound, match="no key of the fuses default, inbound"):
        admin.reset("agent-404")
    with pytest.raises(KeyNotFound, match="TOKENFUSE_SECRET"):
        admin.find(KeyRef.secret("sk-live-not-a-key-we-know-1234"))


def test_a_string_that_is_both_a_key_id_and_a_name_is_ambiguous(admin: Admin, fuses: Pair) -> None:
    outbound, _ = fuses
    outbound.record(Identity.secret(SECRET), 100)
    key_id = outbound.key_id(Identity.secret(SECRET))
    outbound.record(key_id, 5)  # an application chose this very string as a name
    with pytest.raises(AmbiguousKey, match=f"--id {key_id} or --name {key_id}"):
        admin.find(key_id)
    assert admin.find(KeyRef.key_id(key_id))[0].status.rate == 100.0
    assert admin.find(KeyRef.name(key_id))[0].status.rate == 5.0


def test_a_key_id_start_shared_by_two_keys_asks_for_more(admin: Admin, fuses: Pair) -> None:
    outbound, _ = fuses
    names = [f"agent-{n}" for n in range(1_500)]  # two share a 4-character start, surely
    for name in names:
        outbound.record(name, 1)
    ids = sorted(outbound.key_id(name) for name in names)
    shared = next(a[:4] for a, b in itertools.pairwise(ids) if a[:4] == b[:4])
    with pytest.raises(AmbiguousKey, match="give more of it"):
        admin.find(shared)


def test_reset_limits_and_buckets_change_live_and_are_reported(admin: Admin, fuses: Pair) -> None:
    outbound, inbound = fuses
    outbound.record("agent-1", 20_000)  # trips
    inbound.admit("agent-1")  # the same name inbound: two keys
    (reset,) = admin.reset("agent-1", fuse="default")
    assert reset.state == "idle" and outbound.gate("agent-1").allowed
    with pytest.raises(AmbiguousKey, match="--fuse default or --fuse inbound"):
        admin.set_limit("agent-1", "50k/min")
    view = admin.set_limit("agent-1", "50k/min", fuse="default")
    assert view.status.limit == 50_000.0
    assert admin.set_bucket("agent-1", capacity=7, rate="120/min").status.bucket_capacity == 7.0
    assert inbound.status("agent-1").bucket_rate == 2.0
    fresh = admin.set_limit("agent-new", 100)  # a name may get its limit before its traffic
    assert (fresh.fuse, fresh.status.limit) == ("default", 100.0)
    kinds = [(event.kind, event.key, event.fuse) for event in admin.events()]
    assert ("reset", "agent-1", "default") in kinds
    assert ("configured", "agent-new", "default") in kinds
    assert all(event.key_id == outbound.key_id(str(event.key)) for event in admin.events())


def test_forgive_says_it_is_not_available_yet(admin: Admin, fuses: Pair) -> None:
    fuses[0].record("agent-1", 1)
    if hasattr(Fuse, "forgive"):
        pytest.skip("this version has Fuse.forgive")
    with pytest.raises(NotAvailable, match="reset closes a key at once"):
        admin.forgive("agent-1")
