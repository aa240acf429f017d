"""``ReadState``: a key's state itself, the one ``ReadStatus`` computes its view from.

The admin page shows more of a key than its status (the window slot by slot, its trips), so it
reads the state; both stores must give the very state the core keeps.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from tests.stores.conftest import Backend
from tokenfuse import BucketPolicy, VelocityPolicy
from tokenfuse._core.status import status_of
from tokenfuse._stores.ops import Admit, ListKeys, ReadState, ReadStatus, Record
from tokenfuse._stores.redis import RedisStore

OPEN = VelocityPolicy(cold_start_limit=None)
BUCKET = BucketPolicy(rate=1, capacity=10)


async def test_read_state_is_the_state_status_is_computed_from(backend: Backend) -> None:
    await backend.run(Admit("k", 1.0, 300.0, OPEN, BUCKET))
    backend.clock.advance(7)
    await backend.run(Admit("k", 1.0, 200.0, OPEN, BUCKET))

    state = await backend.run(ReadState("k"))
    status = await backend.run(ReadStatus("k", OPEN, BUCKET))

    assert state.key == "k" and state.now == backend.clock.now
    assert state.velocity is not None and state.bucket is not None
    assert sorted(amount for amount in state.velocity.amounts if amount) == [200.0, 300.0]
    assert sum(state.velocity.minute_amounts) == 500.0  # the long window's minutes
    assert status_of("k", state.velocity, state.bucket, state.now, OPEN, BUCKET) == status
    assert (status.rate, status.bucket_level) == (500.0, 9.0)  # 10 - 1, refilled, - 1


async def test_an_unknown_key_reads_as_no_state(backend: Backend) -> None:
    state = await backend.run(ReadState("nobody"))
    assert (state.velocity, state.bucket) == (None, None)


def test_a_memory_state_read_is_a_copy() -> None:
    from tokenfuse import MemoryStore

    store = MemoryStore()
    store.run(Record("k", 5.0, OPEN))
    state = store.run(ReadState("k"))
    assert state.velocity is not None
    state.velocity.amounts[:] = [1e9] * len(state.velocity.amounts)
    assert store.run(ReadStatus("k", OPEN, None)).rate == 5.0


@pytest.mark.redis
def test_a_decoding_client_still_reads_and_lists_the_packed_state(redis_url: str) -> None:
    """A client built with decode_responses=True gets the packed state as bytes all the same."""
    prefix = f"tf-rs-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        store = RedisStore(client, prefix=prefix)
        store.run(Record("x:1", 42.0, OPEN))
        state = store.run(ReadState("x:1"))
        assert state.velocity is not None and sum(state.velocity.minute_amounts) == 42.0
        [status] = store.run(ListKeys("x:", OPEN, None)).statuses
        assert (status.key, status.rate) == ("x:1", 42.0)
    finally:
        client.delete(*client.scan_iter(match=f"{prefix}:*"))
        client.close()
