"""Run budgets under concurrency, on a real Redis and a real Redis Cluster: 8 processes x 4
threads spend against one run through ``FuseTransport``, each call reserving before it is
sent and settling with its real usage after.

The bound (docs/guards.md#run-budgets): a reservation is granted only while
``spent + reserved + estimate <= limit``, so a run can only go over its limit by what its
calls really spent beyond their estimates; once it is over, nothing more is granted, so at
most the calls in flight at that moment add their excess::

    spent <= limit + concurrent calls x largest (real usage - estimate)

Here every call asks for 100 output tokens (its estimate is those plus its body's size) and
really spends 50-160 tokens, so the run may end at most 32 x 160 over its limit (no call's
excess reaches its whole usage), and it must end with nothing reserved and exactly what the
answered calls reported spent: no update lost.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from tests.stores import budget_workers
from tests.stores.budget_workers import SECRET, USAGE
from tests.stores.conftest import unique_prefix
from tokenfuse import Fuse, RedisStore
from tokenfuse._stores.ops import OpenRun, ReadRun
from tokenfuse._stores.redis_codec import key_of

SPAWN = multiprocessing.get_context("spawn")
PROCESSES, THREADS = 8, 4
LIMIT = 60_000.0
TTL = 3_600.0


def drill(url: str, prefix: str, cluster: bool, run_ids: list[str]) -> list[Any]:
    ready, go = SPAWN.Barrier(PROCESSES + 1), SPAWN.Event()
    results = SPAWN.Queue()
    processes = [
        SPAWN.Process(
            target=budget_workers.spend,
            args=(url, prefix, cluster, run_ids, THREADS, seed, ready, go, results),
        )
        for seed in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    ready.wait(120)
    go.set()
    found = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(60)
    return found


def check(found: list[Any], state: Any) -> None:
    answered = sum(spent for spent, _, _ in found)
    assert all(refused > 0 for _, refused, _ in found)  # every agent met the limit
    assert state.spent_tokens == answered  # no settlement lost or counted twice
    assert state.reserved_tokens == 0  # every reservation settled or given back
    excess = USAGE[1]  # a call's real usage minus its estimate is below its whole usage
    assert state.spent_tokens <= LIMIT + PROCESSES * THREADS * excess
    largest_estimate = max(estimate for _, _, estimate in found)
    assert state.spent_tokens > LIMIT - PROCESSES * THREADS * largest_estimate  # not starved


@pytest.mark.redis
def test_32_agents_in_8_processes_stay_within_the_bound(redis_url: str) -> None:
    prefix = unique_prefix()
    client = redis.Redis.from_url(redis_url)
    store = RedisStore(client, prefix=prefix, open_keys=False)
    key = Fuse(store, secret=SECRET).run_key("drill-run")
    try:
        store.run(OpenRun(key, LIMIT, -1.0, TTL))
        found = drill(redis_url, prefix, False, ["drill-run"])
        state = store.run(ReadRun(key))
        assert state is not None
        check(found, state)
    finally:
        for name in client.scan_iter(match=f"{prefix}:*"):
            client.delete(name)
        client.close()


@pytest.mark.cluster
def test_nested_runs_in_different_slots_of_a_cluster_stay_within_the_bound(
    cluster_url: str,
) -> None:
    prefix = unique_prefix()
    client = RedisCluster.from_url(cluster_url)
    store = RedisStore(client, prefix=prefix, open_keys=False)
    fuse = Fuse(store, secret=SECRET)
    outer, inner = fuse.run_key("drill-outer"), fuse.run_key("drill-inner")
    slots = {client.get_node_from_key(key_of(prefix, k)).name for k in (outer, inner)}
    assert key_slot(key_of(prefix, outer).encode()) != key_slot(key_of(prefix, inner).encode())
    try:
        store.run(OpenRun(outer, 10 * LIMIT, -1.0, TTL))
        store.run(OpenRun(inner, LIMIT, -1.0, TTL))
        found = drill(cluster_url, prefix, True, ["drill-outer", "drill-inner"])
        inner_state, outer_state = store.run(ReadRun(inner)), store.run(ReadRun(outer))
        assert inner_state is not None and outer_state is not None
        check(found, inner_state)
        # Every answered call counted in both runs; the outer run's holds of the calls the
        # inner one refused were all given back.
        assert outer_state.spent_tokens == inner_state.spent_tokens
        assert outer_state.reserved_tokens == 0
        assert len(slots) >= 1
    finally:
        for key in (outer, inner):
            client.delete(key_of(prefix, key))
        client.close()
