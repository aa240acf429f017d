"""Drill: a Redis that takes connections and never answers costs a decision its budget, once.

A blackholed server (here a loopback listener that accepts and stays silent, and a real
redis-server stopped with SIGSTOP) is the worst outage for a guard: nothing is refused, every
read just waits. With ``RedisStore.from_url`` one decision waits at most ``COMMAND_TIMEOUT``
(0.25 s, not retried), and once ``threshold`` decisions in a row failed with no success for
a second, the back-off skips the store.
The back-off runs on an injected clock; only the cost of each decision is real time.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator

import pytest

from tests.conftest import Clock
from tests.stores.conftest import OwnRedis
from tokenfuse import Fuse, FuseEvent, VelocityPolicy
from tokenfuse._health import StoreHealth
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_budget import COMMAND_TIMEOUT

# One decision may wait one timeout, never two: a retried command (as redis-py's defaults
# did) waits at least 2 x COMMAND_TIMEOUT. Anything under that is one timeout plus this
# machine's scheduling, which on a loaded CI runner has reached 0.2 s.
ONE_TIMEOUT = 2 * COMMAND_TIMEOUT
THRESHOLD = 3


@pytest.fixture
def blackhole() -> Iterator[str]:
    """A listener whose connections the kernel accepts and nobody ever answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"


def make_fuse(url: str, clock: Clock, events: list[FuseEvent]) -> Fuse:
    health = StoreHealth(threshold=THRESHOLD, backoff=5.0, clock=clock)
    return Fuse(RedisStore.from_url(url, prefix="tf-blackhole"), on_event=events.append,
                velocity=VelocityPolicy(limit=100), health=health)  # fmt: skip


def timed(call: object) -> float:
    started = time.monotonic()
    decision = call()  # type: ignore[operator]
    assert decision.allowed and decision.degraded
    return time.monotonic() - started


def test_blackholed_server_costs_one_timeout_then_is_skipped(blackhole: str, clock: Clock) -> None:
    events: list[FuseEvent] = []
    fuse = make_fuse(blackhole, clock, events)
    costs = [timed(lambda: fuse.record("k", 1)) for _ in range(THRESHOLD)]
    print("seconds per decision:", [round(cost, 3) for cost in costs])  # -rP
    assert max(costs) < ONE_TIMEOUT, costs
    skipped = [timed(lambda: fuse.record("k", 1)) for _ in range(20)]
    assert sum(skipped) < 0.05  # backing off: not asked at all
    assert fuse.health.counts.skipped == 20
    assert [e.kind for e in events] == ["store_unavailable"]
    clock.advance(5)  # one probe after the back-off, which costs one timeout again
    assert timed(lambda: fuse.record("k", 1)) < ONE_TIMEOUT
    fuse.store.close()  # type: ignore[union-attr]


async def test_async_blackholed_server_costs_one_timeout(blackhole: str, clock: Clock) -> None:
    events: list[FuseEvent] = []
    fuse = make_fuse(blackhole, clock, events)
    costs = []
    for _ in range(THRESHOLD + 5):
        started = time.monotonic()
        assert (await fuse.arecord("k", 1)).degraded
        costs.append(time.monotonic() - started)
    assert max(costs[:THRESHOLD]) < ONE_TIMEOUT, costs
    assert sum(costs[THRESHOLD:]) < 0.05, costs
    await fuse.store.aclose()  # type: ignore[union-attr]


def test_sigstopped_server_mid_use(own_redis: OwnRedis, clock: Clock) -> None:
    events: list[FuseEvent] = []
    fuse = make_fuse(own_redis.url, clock, events)
    assert fuse.record("k", 60).allowed  # connected, scripts loaded
    assert own_redis.process is not None
    pid = own_redis.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        costs = []
        for _ in range(10):  # until skipped; the fuse's clock follows the time they cost
            costs.append(timed(lambda: fuse.record("k", 60)))
            clock.advance(costs[-1])
            if costs[-1] < 0.05:
                break
        # A store that answered within the last second is not skipped yet: the decisions of
        # that second pay 0.25 s each (five), then it is.
        print("seconds per decision:", [round(cost, 3) for cost in costs])  # -rP
        assert max(costs) < ONE_TIMEOUT, costs
        assert costs[-1] < 0.05 and len(costs) == 6, costs
    finally:
        os.kill(pid, signal.SIGCONT)
    clock.advance(5)
    decision = fuse.record("k", 60)  # the server is back: enforced again
    assert not decision.degraded
    # 60 + 60 is over the ceiling of 100. The stopped server may also run the timed-out
    # records it had buffered once it resumes (a late trip nobody saw): refused either way.
    assert not decision.allowed
    assert [e.kind for e in events][:2] == ["store_unavailable", "store_recovered"]
    fuse.store.close()  # type: ignore[union-attr]
