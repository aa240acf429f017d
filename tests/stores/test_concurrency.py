"""Processes sharing one bucket on a real Redis, on the server's clock: the bucket hands out
what capacity and refill allow, never more, and each token exactly once."""

from __future__ import annotations

import multiprocessing

import pytest
import redis

from tests.stores import workers
from tests.stores.conftest import delete_prefix, read_states, unique_prefix
from tokenfuse import BucketPolicy
from tokenfuse._stores.ops import Admit
from tokenfuse._stores.redis import RedisStore

pytestmark = pytest.mark.redis

SPAWN = multiprocessing.get_context("spawn")  # fresh interpreters: no state shared by fork


@pytest.fixture
def prefix(redis_url: str):  # type: ignore[no-untyped-def]
    name = unique_prefix()
    yield name
    client = redis.Redis.from_url(redis_url)
    delete_prefix(client, name)
    client.close()


def test_processes_hammering_one_bucket_get_capacity_plus_refill(
    redis_url: str, prefix: str
) -> None:
    bucket = BucketPolicy(rate=200, capacity=50)
    processes = 3
    ready, go, results = SPAWN.Barrier(processes + 1), SPAWN.Event(), SPAWN.Queue()
    jobs = [
        SPAWN.Process(
            target=workers.hammer,
            args=(redis_url, prefix, "k", bucket, 1.0, ready, go, results),
        )
        for _ in range(processes)
    ]
    for job in jobs:
        job.start()
    client = redis.Redis.from_url(redis_url)
    try:
        ready.wait(60)
        # A new bucket is full at t0 (server clock). Taking its whole capacity at once leaves
        # it empty at t0, so while the workers hammer it never refills up to the cap, and
        # every token it gets back can be accounted for.
        store = RedisStore(client, prefix=prefix)
        assert store.run(Admit("k", cost=50, amount=0, velocity=None, bucket=bucket)).allowed
        [(_, drained)] = read_states(client, prefix, ["k"])
        go.set()
        counts = [results.get(timeout=60) for _ in jobs]
        for job in jobs:
            job.join(30)
        [(_, end)] = read_states(client, prefix, ["k"])
    finally:
        client.close()
    assert drained is not None and end is not None
    assert drained.tokens == 0.0
    admitted = sum(admitted for admitted, _ in counts)
    calls = sum(calls for _, calls in counts)
    assert calls > 2 * admitted > 0  # they did hammer: most calls found the bucket empty

    refill = bucket.rate * (end.updated - drained.updated)  # server seconds since t0
    slack = 1e-6 * calls  # bucket.py forgives 1e-6 of a token per call (clock resolution)
    assert 50 + admitted <= bucket.capacity + refill + slack  # never more
    assert admitted + end.tokens == pytest.approx(refill, abs=slack)  # and nothing lost


def test_exactly_one_of_two_racers_gets_the_last_token(redis_url: str, prefix: str) -> None:
    keys = [f"last-{n}" for n in range(300)]
    bucket = BucketPolicy(rate=1e-9, capacity=1)
    ready, results = SPAWN.Barrier(2), SPAWN.Queue()
    jobs = [
        SPAWN.Process(target=workers.race, args=(redis_url, prefix, keys, bucket, ready, results))
        for _ in range(2)
    ]
    for job in jobs:
        job.start()
    first, second = results.get(timeout=60), results.get(timeout=60)
    for job in jobs:
        job.join(30)
    assert all(a != b for a, b in zip(first, second, strict=True))  # one winner per token
