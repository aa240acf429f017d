"""The Lua library remembers the states it wrote (``_lib.lua``, ``remember``): a decision that
reads back the string the last one wrote skips unpacking it. What it reads must still be what
the key holds, whoever wrote it, and a record must keep the bucket block beside it as it was."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.conftest import Clock
from tests.stores.conftest import delete_prefix, unique_prefix
from tokenfuse import BucketPolicy, VelocityPolicy
from tokenfuse._stores.ops import Admit, Record
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_codec import key_of

pytestmark = pytest.mark.redis

POLICY = VelocityPolicy(limit=1000)
BUCKET = BucketPolicy(rate=1, capacity=5)


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def store(redis_url: str, raw: redis.Redis, clock: Clock) -> Iterator[RedisStore]:
    made = RedisStore(redis.Redis.from_url(redis_url), prefix=unique_prefix(), clock=clock)
    yield made
    made.close()
    delete_prefix(raw, made.prefix)


def test_a_state_written_by_another_is_read_not_the_remembered_one(
    store: RedisStore, raw: redis.Redis
) -> None:
    assert store.run(Record("open", 600, POLICY)).allowed
    assert store.run(Record("open", 600, POLICY)).tripped  # open for a while
    for _ in range(3):
        assert store.run(Record("k", 1, POLICY)).allowed  # k's tables remembered, closed
    raw.set(key_of(store.prefix, "k"), raw.get(key_of(store.prefix, "open")))
    assert not store.run(Record("k", 1, POLICY)).allowed  # the open state it now holds
    assert store.scripts == "functions"  # the path that remembers between calls


@pytest.mark.parametrize("velocity", [None, POLICY], ids=["bucket only", "both blocks"])
def test_a_record_keeps_the_bucket_block_as_it_was(
    store: RedisStore, raw: redis.Redis, velocity: VelocityPolicy | None
) -> None:
    key = key_of(store.prefix, "k")
    for _ in range(2):
        assert store.run(Admit("k", cost=2, amount=1, velocity=velocity, bucket=BUCKET)).allowed
    before = raw.get(key)
    assert before is not None and len(before) == (64 if velocity is None else 768)
    for _ in range(2):
        assert store.run(Record("k", 10, POLICY)).allowed
    after = raw.get(key)
    assert after is not None and len(after) == 768
    assert after[-64:] == before[-64:]


def test_two_keys_that_hold_the_same_bytes_do_not_share_tables(
    store: RedisStore, raw: redis.Redis
) -> None:
    for _ in range(3):
        assert store.run(Record("a", 100, POLICY)).allowed
    raw.set(key_of(store.prefix, "b"), raw.get(key_of(store.prefix, "a")))  # b = a, bytes
    assert store.run(Record("a", 100, POLICY)).rate == 400.0  # a's tables, taken and changed
    assert store.run(Record("b", 1, POLICY)).rate == 301.0  # b's own bytes, not a's tables
