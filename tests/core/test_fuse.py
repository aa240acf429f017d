"""Fuse: events, fail open/closed, identities, async faces, bounded memory."""

from __future__ import annotations

import logging
import pickle
from typing import TypeVar

import pytest

from tests.conftest import Clock
from tokenfuse import (
    ConfigurationError,
    Fuse,
    FuseEvent,
    Identity,
    LoopSuspected,
    MemoryStore,
    Status,
    StoreUnavailable,
    VelocityPolicy,
)
from tokenfuse._health import StoreHealth
from tokenfuse._stores.memory import MemoryStore as _Memory
from tokenfuse._stores.ops import Op

R = TypeVar("R")


class FlakyStore(_Memory):
    """A MemoryStore whose every call fails while ``down`` is set, as a dead Redis would."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock=clock)
        self.down = False
        self.calls = 0

    def run(self, op: Op[R]) -> R:
        self.calls += 1
        if self.down:
            raise StoreUnavailable("connection refused")
        return super().run(op)


def test_trip_event_reaches_hooks_and_log(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    events: list[FuseEvent] = []
    policy = VelocityPolicy(limit=100)
    fuse = Fuse(MemoryStore(clock=clock), velocity=policy, on_event=events.append)
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        decision = fuse.record(Identity.secret("sk-proj-SECRETSECRET1234"), 500)
    assert decision.tripped
    assert [e.kind for e in events] == ["tripped"]
    key_id = fuse.key_id(Identity.secret("sk-proj-SECRETSECRET1234"))
    assert (events[0].key, events[0].key_id) == ("sk-…1234", key_id)
    assert isinstance(events[0].error, Exception)
    assert events[0].error.key_id == key_id
    assert f"sk-…1234 [id {key_id}]" in caplog.text
    assert "SECRETSECRET" not in caplog.text


def test_status_names_the_key_by_its_label_and_id(clock: Clock) -> None:
    fuse = Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(limit=100, cooldown=60))
    secret = Identity.secret("sk-proj-SECRETSECRET1234")
    key_id = fuse.key_id(secret)
    assert fuse.status(secret) == Status(key="sk-…1234", key_id=key_id)  # never seen
    assert fuse.record(secret, 500).tripped
    assert fuse.status(secret) == Status(
        key="sk-…1234",
        key_id=key_id,
        rate=500.0,
        open_until=clock.now + 60,
        limit=100.0,
        first_seen=clock.now,
    )


def test_raw_secret_never_reaches_the_store(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    Fuse(store).record(Identity.secret("sk-live-abcdef0123456789"), 10)
    assert all("abcdef" not in key for key in store._entries)


def test_a_failing_hook_does_not_break_the_call(clock: Clock) -> None:
    def broken(event: FuseEvent) -> None:
        raise RuntimeError("pager down")

    fuse = Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(limit=1), on_event=broken)
    assert fuse.record("k", 5).tripped


def test_fail_open_logs_once_and_backs_off(clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    store = FlakyStore(clock)
    events: list[FuseEvent] = []
    health = StoreHealth(threshold=3, backoff=5.0, clock=clock)
    fuse = Fuse(store, velocity=VelocityPolicy(limit=1), on_event=events.append, health=health)
    store.down = True
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        decisions = [fuse.record("k", 50) for _ in range(10)]
    assert all(d.allowed and d.degraded for d in decisions)
    assert store.calls == 3  # then the store is skipped: no timeout paid on every call
    assert [e.kind for e in events] == ["store_unavailable"]
    assert caplog.text.count("store unavailable") == 1
    clock.advance(5)
    store.down = False
    assert fuse.record("k", 50).tripped  # back in use after the back-off: checks resume
    assert [e.kind for e in events] == ["store_unavailable", "store_recovered", "tripped"]


def test_fail_closed_raises(clock: Clock) -> None:
    store = FlakyStore(clock)
    store.down = True
    fuse = Fuse(store, fail_closed=True)
    with pytest.raises(StoreUnavailable):
        fuse.gate("k")


async def test_async_faces_share_the_state(clock: Clock) -> None:
    fuse = Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(limit=100))
    assert (await fuse.arecord("k", 60)).allowed
    decision = fuse.record("k", 60)
    assert decision.tripped
    refusal = await fuse.agate("k")
    with pytest.raises(Exception, match="ceiling"):
        refusal.raise_if_refused()
    assert (await fuse.astatus("k")).open_until is not None
    await fuse.areset("k")
    assert (await fuse.agate("k")).allowed


def test_unknown_or_bad_amounts_record_nothing(clock: Clock) -> None:
    fuse = Fuse(MemoryStore(clock=clock))
    for amount in (0, -5, float("nan"), float("inf")):
        assert fuse.record("k", amount).allowed
    assert fuse.status("k").rate == 0


def test_refusal_survives_pickling_and_renders_as_json() -> None:
    error = LoopSuspected(key="sk-…a1b2", rate=3150, limit=3000, baseline=300, multiple=10.5,
                          retry_after=60)  # fmt: skip
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error)
    assert copy.as_dict() == error.as_dict()
    assert error.as_dict()["type"] == "loop_suspected"


@pytest.mark.parametrize("name", ["", "has space", "x" * 65, "a:b"])
def test_fuse_name_is_validated(name: str) -> None:
    with pytest.raises(ConfigurationError):
        Fuse(name=name)


def test_identities_are_bounded_and_printable() -> None:
    huge = "a\x00\n" * 100_000
    identity = Identity.named(huge)
    assert len(identity.label) <= 64
    assert identity.label.isprintable()
    assert len(Fuse()._key(identity)) == len("default:") + 32


def test_each_identity_keeps_its_own_key_when_calls_alternate(clock: Clock) -> None:
    # The fuse keeps the last identity's key and key id: a call for another must not get them.
    secret = "a test secret of 32 characters.."
    fuse = Fuse(MemoryStore(clock=clock), secret=secret)
    a, b = Identity.named("agent-a"), Identity.secret("sk-proj-SECRETSECRET1234")
    for who, amount in [(a, 100.0), (b, 5.0), (a, 100.0), (b, 5.0), (b, 5.0)]:
        fuse.record(who, amount)
    assert (fuse.status(a).rate, fuse.status(b).rate) == (200.0, 15.0)
    fresh = Fuse(MemoryStore(clock=clock), secret=secret)  # derives each from scratch
    assert [fuse.key_id(who) for who in (a, b, a)] == [fresh.key_id(who) for who in (a, b, a)]
    assert fuse.key_id(a) != fuse.key_id(b)


def test_a_renamed_fuse_counts_under_its_new_name(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    fuse = Fuse(store, name="before")
    fuse.record("agent-a", 100.0)
    fuse.name = "after"
    fuse.record("agent-a", 7.0)
    assert fuse.status("agent-a").rate == 7.0
    assert Fuse(store, name="before").status("agent-a").rate == 100.0


@pytest.mark.slow
def test_a_million_identities_keep_memory_at_the_bound(clock: Clock) -> None:
    store = MemoryStore(max_keys=10_000, clock=clock)
    fuse = Fuse(store)
    for i in range(1_000_000):
        fuse.record(f"k{i}", 1.0)
        if i % 100_000 == 0:
            clock.advance(1)
    assert len(store) == 10_000
    assert fuse.status("k999999").rate == 1.0  # newest kept
    assert fuse.status("k0").rate == 0.0  # oldest evicted


def test_entries_expire_lazily(clock: Clock) -> None:
    store = MemoryStore(ttl=60, clock=clock)
    fuse = Fuse(store)
    fuse.record("k", 10)
    clock.advance(61)
    assert fuse.status("k").rate == 0
    fuse.record("other", 1)
    assert fuse.status("k").samples == 0


def test_forgive_is_reported_as_an_event(clock: Clock) -> None:
    seen: list[FuseEvent] = []
    fuse = Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(limit=10), on_event=seen.append)
    fuse.record("nightly-batch", 100)

    fuse.forgive("nightly-batch")

    assert [event.kind for event in seen] == ["tripped", "forgiven"]
    assert seen[-1].key_id == fuse.key_id("nightly-batch")
    assert fuse.gate("nightly-batch").allowed
