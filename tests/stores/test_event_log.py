"""Operator events reach every process that shares a store, and only events are written.

Two ``Fuse`` objects on two ``RedisStore`` instances stand for two processes: what one trips,
resets or reconfigures, the other's log shows, with the key's label and id.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from tests.stores.conftest import OwnRedis, delete_prefix
from tokenfuse import Fuse, MemoryStore, VelocityPolicy
from tokenfuse._events import FuseEvent
from tokenfuse._identity import Identity
from tokenfuse._stores.event_log import MemoryEventLog
from tokenfuse._stores.redis import RedisStore
from tokenfuse.stores import StoreHealth

CEILING = VelocityPolicy(limit=1_000, cooldown=30)


@pytest.fixture(autouse=True)
def deployment_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """One secret for every process (``TOKENFUSE_SECRET``): ``Identity.key_id`` is then the
    id the fuses show."""
    monkeypatch.setenv("TOKENFUSE_SECRET", "event-log-tests-secret-0123456789")


@pytest.fixture(autouse=True)
def closing_stores(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every store a test builds is closed after it: its sockets are not left for the
    collector to report in some later test."""
    opened: list[RedisStore] = []
    build = RedisStore.from_url

    def from_url(*args: Any, **options: Any) -> RedisStore:
        store = build(*args, **options)
        opened.append(store)
        return store

    monkeypatch.setattr(RedisStore, "from_url", from_url)
    yield
    for store in opened:
        store.close()


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    name = f"tf-ev-{uuid.uuid4().hex[:8]}"
    yield name
    with redis.Redis.from_url(redis_url) as raw:
        delete_prefix(raw, name)


def test_a_trip_in_one_process_is_in_the_log_of_another(redis_url: str, prefix: str) -> None:
    here = Fuse(RedisStore.from_url(redis_url, prefix=prefix), velocity=CEILING)
    there = Fuse(RedisStore.from_url(redis_url, prefix=prefix), velocity=CEILING)
    secret = Identity.secret("sk-proj-0123456789abcdef9c21")

    here.record(secret, 600)
    assert there.store.events.recent(10) == []  # allowed decisions write nothing
    here.record(secret, 600)  # trips

    [event] = there.store.events.recent(10)
    assert (event.kind, event.fuse, event.label, event.key_id) == (
        "tripped", "default", "sk-…9c21", secret.key_id,
    )  # fmt: skip
    assert (event.reason, event.rate, event.limit, event.retry_after) == (
        "manual_ceiling", 1200.0, 1000.0, 30.0,
    )  # fmt: skip
    assert event.origin.endswith(f":{__import__('os').getpid()}")
    assert "0123456789abcdef" not in repr(event)  # never the credential
    assert there.store.events.labels("default", [secret.key_id, "000000000000"]) == {
        secret.key_id: "sk-…9c21"
    }


def test_resets_and_live_changes_are_logged_for_everyone(redis_url: str, prefix: str) -> None:
    here = Fuse(RedisStore.from_url(redis_url, prefix=prefix), velocity=CEILING)
    there = Fuse(RedisStore.from_url(redis_url, prefix=prefix), velocity=CEILING)

    here.set_limit("agent-7", "50k/min")
    here.set_bucket("agent-7", rate="600/min", capacity=None)
    here.reset("agent-7")

    kinds = [(e.kind, e.label, e.key_id) for e in there.store.events.recent(10)]
    key_id = Identity.named("agent-7").key_id
    assert kinds == [
        ("configured", "agent-7", key_id),
        ("configured", "agent-7", key_id),
        ("reset", "agent-7", key_id),
    ]
    details = [e.detail for e in there.store.events.recent(3)]
    assert "manual ceiling 50,000 tokens/min" in details[0]
    assert "bucket refill 10/s" in details[1] and "bucket capacity back to the policy" in details[1]


def test_reading_after_an_id_and_since_a_time(redis_url: str, prefix: str) -> None:
    fuse = Fuse(RedisStore.from_url(redis_url, prefix=prefix), velocity=CEILING)
    log = fuse.store.events
    started = time.time()
    for n in range(3):
        fuse.reset(f"agent-{n}")
    first, _, third = log.recent(3)

    assert [e.label for e in log.read(first.id, 10, block=0)] == ["agent-1", "agent-2"]
    assert log.read(third.id, 10, block=0) == []
    assert [e.label for e in log.since(started - 1, 10)] == ["agent-0", "agent-1", "agent-2"]
    assert log.since(time.time() + 60, 10) == []
    assert [e.label for e in log.read("", 2, block=0)] == ["agent-0", "agent-1"]


def test_a_blocking_read_waits_on_the_server_beyond_a_decisions_timeout(
    redis_url: str, prefix: str
) -> None:
    """A decision waits 0.25 s for Redis at most; the log reads on a client of its own, so a
    read may block for longer without looking like a dead server, and returns as soon as an
    event comes."""
    store = RedisStore.from_url(redis_url, prefix=prefix)
    started = time.monotonic()
    assert store.events.read("", 10, block=1.2) == []
    assert 1.2 <= time.monotonic() - started < 3.0

    writer = threading.Thread(target=reset_once_a_reader_blocks, args=(redis_url, store))
    writer.start()
    started = time.monotonic()
    [event] = store.events.read("", 10, block=20.0)
    writer.join(10)
    assert event.label == "agent-late"
    assert time.monotonic() - started < 10.0


def reset_once_a_reader_blocks(redis_url: str, store: RedisStore) -> None:
    """Log an event once some client is blocked in XREAD (its state, not a guess of time)."""
    with redis.Redis.from_url(redis_url) as raw:
        for _ in range(1_000):
            if any(client.get("cmd") == "xread" for client in raw.client_list()):
                break
            time.sleep(0.01)
    Fuse(store).reset("agent-late")


def test_a_callers_client_with_a_short_timeout_reads_without_blocking(
    redis_url: str, prefix: str
) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=0.25)
    store = RedisStore(client, prefix=prefix)
    started = time.monotonic()
    assert store.events.read("", 10, block=1.0) == []  # no "Timeout reading from socket"
    assert 1.0 <= time.monotonic() - started < 3.0
    client.close()


def test_the_stream_is_capped(redis_url: str, prefix: str) -> None:
    store = RedisStore.from_url(redis_url, prefix=prefix)
    store.events.maxlen = 10
    fuse = Fuse(store)
    for n in range(300):
        fuse.reset(f"agent-{n}")
    with redis.Redis.from_url(redis_url) as raw:
        length = raw.xlen(store.events.stream)
    # MAXLEN ~ trims whole stream nodes (100 entries by default): about the cap, not 300.
    assert 10 <= length <= 110


async def test_an_asyncio_only_store_logs_from_a_task(redis_url: str, prefix: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    store = RedisStore(client, prefix=prefix)
    fuse = Fuse(store, velocity=CEILING)
    await fuse.arecord("agent-async", 2_000)
    await store.events.aflush()
    [event] = await store.events.arecent(5)
    assert (event.kind, event.label) == ("tripped", "agent-async")
    assert await store.events.alabels("default", [event.key_id or ""]) == {
        event.key_id: "agent-async"
    }
    await client.aclose()


async def test_a_store_with_a_sync_client_logs_before_the_decision_returns(
    redis_url: str, prefix: str
) -> None:
    store = RedisStore.from_url(redis_url, prefix=prefix)
    await Fuse(store, velocity=CEILING).arecord("agent-async", 2_000)
    assert [event.kind for event in store.events.recent(5)] == ["tripped"]  # no flush needed
    await store.aclose()


def test_an_outage_is_logged_once_the_store_is_back(own_redis: OwnRedis) -> None:
    health = StoreHealth(threshold=1, backoff=0.0, answered_within=0.0)
    store = RedisStore.from_url(own_redis.url, prefix="outage")
    fuse = Fuse(store, velocity=CEILING, health=health)
    fuse.record("agent-1", 1)  # the store answers
    own_redis.stop()
    assert fuse.record("agent-1", 1).degraded  # store_unavailable: held, not written
    own_redis.start()
    assert not fuse.record("agent-1", 1).degraded  # store_recovered: written, and the held one

    kinds = [event.kind for event in store.events.recent(10)]
    assert kinds == ["store_unavailable", "store_recovered"]


def test_the_memory_log_is_a_bounded_ring_with_labels() -> None:
    log = MemoryEventLog(size=3, labels=2)
    record = log.recorder("default")
    for n in range(5):
        record(FuseEvent("reset", f"agent-{n}", "reset", key_id=f"id{n}"))

    assert [e.label for e in log.recent(10)] == ["agent-2", "agent-3", "agent-4"]
    assert [e.label for e in log.read("3", 10, block=0)] == ["agent-3", "agent-4"]
    assert log.labels("default", ["id0", "id3", "id4"]) == {"id3": "agent-3", "id4": "agent-4"}
    assert log.labels("inbound", ["id4"]) == {}


def test_a_memory_store_keeps_its_fuses_events() -> None:
    store = MemoryStore()
    Fuse(store, velocity=CEILING).record("agent-1", 5_000)
    Fuse(store, name="inbound").reset("agent-2")
    assert [(e.kind, e.fuse) for e in store.events.recent(10)] == [
        ("tripped", "default"),
        ("reset", "inbound"),
    ]


async def test_memory_reads_wait_for_an_event() -> None:
    log = MemoryEventLog()
    record = log.recorder("default")

    async def later() -> None:
        await asyncio.sleep(0)  # let the reader start waiting first
        record(FuseEvent("reset", "agent-1", "reset", key_id="id1"))

    writer = asyncio.ensure_future(later())
    [event] = await log.aread("", 10, block=5.0)
    await writer
    assert event.label == "agent-1"
