"""Run budgets in every store, on the simulated clock: the operations, expiry and bounds."""

from __future__ import annotations

import pytest

from tests.conftest import Clock
from tests.stores.conftest import Backend
from tokenfuse import MemoryStore
from tokenfuse._stores.ops import OpenRun, ReadRun, Reserve, Settle

RUN = "run:0123456789abcdef0123456789abcdef"
TTL = 600.0


async def test_a_run_reserves_settles_and_refuses(backend: Backend) -> None:
    opened = await backend.run(OpenRun(RUN, 1_000.0, 2.0, TTL))
    assert opened.allowed and opened.state.token_limit == 1_000
    assert (await backend.run(Reserve(RUN, 600.0, 0.5, TTL))).allowed
    refused = await backend.run(Reserve(RUN, 500.0, 0.1, TTL))
    assert (refused.allowed, refused.unit, refused.exceeded) == (False, "tokens", True)
    settled = await backend.run(Settle(RUN, 600.0, 0.5, 820.0, 1.7, TTL))
    assert settled.near  # 82 % of the tokens, 85 % of the dollars
    state = await backend.run(ReadRun(RUN))
    assert state is not None
    assert (state.spent_tokens, state.spent_usd, state.reserved_tokens) == (820, 1.7, 0)
    refused = await backend.run(Reserve(RUN, 10.0, 0.31, TTL))
    assert (refused.allowed, refused.unit) == (False, "usd")


async def test_a_joined_run_keeps_its_limits_and_an_unknown_one_has_none(
    backend: Backend,
) -> None:
    await backend.run(OpenRun(RUN, 1_000.0, -1.0, TTL))
    joined = await backend.run(OpenRun(RUN, -1.0, -1.0, TTL, join=True))
    assert joined.state.token_limit == 1_000
    other = await backend.run(OpenRun(RUN[:-1] + "0", -1.0, -1.0, TTL, join=True))
    assert (other.state.token_limit, other.state.usd_limit) == (-1, -1)
    assert (await backend.run(Reserve(RUN[:-1] + "0", 1e12, 1e6, TTL))).allowed


async def test_a_run_expires_ttl_after_its_last_write(backend: Backend, clock: Clock) -> None:
    await backend.run(OpenRun(RUN, 1_000.0, -1.0, TTL))
    clock.advance(TTL - 1)
    await backend.run(Settle(RUN, 0.0, 0.0, 900.0, 0.0, TTL))  # a write: expiry moves on
    clock.advance(TTL - 1)
    state = await backend.run(ReadRun(RUN))
    assert state is not None and state.spent_tokens == 900
    clock.advance(1)
    assert await backend.run(ReadRun(RUN)) is None
    assert (await backend.run(Reserve(RUN, 5_000.0, 0.0, TTL))).allowed  # starts afresh


@pytest.mark.redis
async def test_redis_writes_each_run_with_its_own_ttl(redis_backend: Backend) -> None:
    if redis_backend.raw is None or redis_backend.kind == "fakeredis":
        pytest.skip("checks the real server's PTTL")
    await redis_backend.run(OpenRun(RUN, 1_000.0, -1.0, 90.0))
    ttl = redis_backend.raw.pttl(redis_backend.key(RUN))
    assert 85_000 < ttl <= 90_000
    assert len(redis_backend.raw.get(redis_backend.key(RUN)) or b"") == 72  # nine doubles


def test_memory_runs_are_bounded_and_keep_runs_with_calls_in_flight(clock: Clock) -> None:
    store = MemoryStore(clock=clock, max_runs=20)
    busy = "run:busy"
    store.run(OpenRun(busy, 100.0, -1.0, TTL))
    store.run(Reserve(busy, 50.0, 0.0, TTL))  # a call in flight
    for n in range(1_000):
        store.run(OpenRun(f"run:{n}", 100.0, -1.0, TTL))
    assert len(store._runs) == 20
    assert store.run_evictions == 1_000 + 1 - 20
    state = store.run(ReadRun(busy))
    assert state is not None and state.reserved_tokens == 50  # not evicted to start afresh
