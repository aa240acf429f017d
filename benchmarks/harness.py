"""What every benchmark here shares: the options, the interleaved timing loop, percentiles,
and keys of its own on the shared Redis (a prefix, deleted afterwards).

Each benchmark file runs as a script (``python benchmarks/bench_store.py``), which puts this
folder on ``sys.path``: they import it as ``harness``.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

REDIS_URL = "redis://127.0.0.1:6379/15"

#: A case is called with no arguments; it may return an awaitable (an async case), awaited
#: inside the timing.
Case = Callable[[], object]


def options(description: str) -> argparse.ArgumentParser:
    """An argument parser with ``--redis`` (database 15 of the local server by default)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--redis", default=REDIS_URL, help=f"Redis URL (default {REDIS_URL})")
    return parser


def unique_prefix(kind: str) -> str:
    """A key prefix no other run uses: benchmarks share the server with tests and each other."""
    return f"bench-{kind}-{uuid.uuid4().hex[:8]}"


def delete_keys(url: str, pattern: str) -> None:
    """Delete the keys matching ``pattern`` (SCAN, never FLUSHDB: the server is shared)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


async def interleave(
    cases: Mapping[str, Case], calls: int, *, warmup: int = 200
) -> dict[str, list[float]]:
    """Microseconds of each of ``calls`` calls per case, the cases taking turns call by call,
    so that noise on the machine hits them all alike.

    Each case first runs ``warmup`` times on its own (imports, connections, script loading,
    caches), which also tells whether it is async; nothing else happens inside the timing.
    """
    turns: list[tuple[Callable[[], Any], bool, list[float]]] = []
    times: dict[str, list[float]] = {}
    for name, case in cases.items():
        is_async = False
        for _ in range(max(warmup, 1)):
            result = case()
            if inspect.isawaitable(result):
                is_async = True
                await result
        times[name] = []
        turns.append((case, is_async, times[name]))
    clock = time.perf_counter_ns
    for _ in range(calls):
        for case, is_async, spent in turns:
            start = clock()
            if is_async:
                await case()
            else:
                case()
            spent.append((clock() - start) / 1000)
    return times


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile (1..99) of ``values``."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def median(values: list[float]) -> float:
    return statistics.median(values)
