"""Code run in the OS processes of test_concurrency (spawned: imported afresh, so kept small)."""

from __future__ import annotations

import time
from typing import Any

import redis

from tokenfuse import BucketPolicy
from tokenfuse._stores.ops import Admit, Gate
from tokenfuse._stores.redis import RedisStore


def hammer(url: str, prefix: str, key: str, bucket: BucketPolicy, seconds: float,
           ready: Any, go: Any, results: Any) -> None:  # fmt: skip
    """Admit as fast as possible for ``seconds`` on the server clock; report the count."""
    client = redis.Redis.from_url(url)
    store = RedisStore(client, prefix=prefix)
    store.run(Gate(key))  # connect and load the scripts before the start
    ready.wait(30)
    go.wait(30)
    admitted = calls = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        calls += 1
        admitted += store.run(Admit(key, cost=1, amount=0, velocity=None, bucket=bucket)).allowed
    results.put((admitted, calls))
    client.close()


def race(url: str, prefix: str, keys: list[str], bucket: BucketPolicy,
         ready: Any, results: Any) -> None:  # fmt: skip
    """Ask once for the one token of each key, in the same order as the other racer."""
    client = redis.Redis.from_url(url)
    store = RedisStore(client, prefix=prefix)
    store.run(Gate(keys[0]))
    ready.wait(30)
    won = [
        store.run(Admit(k, cost=1, amount=0, velocity=None, bucket=bucket)).allowed for k in keys
    ]
    results.put(won)
    client.close()
