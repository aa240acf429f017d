"""Per-decision latency of the stores, side by side with redis-py PING and `limits`, in one run.

    python benchmarks/bench_store.py [--redis redis://127.0.0.1:6379/15] [--ops 3000]

Cases run interleaved in rounds so that machine noise hits them all alike; what matters is the
ratios printed at the end, not the absolute microseconds (which depend on the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable

import redis
import redis.asyncio as aredis
from limits import parse, storage, strategies
from limits.aio import storage as astorage
from limits.aio import strategies as astrategies

from tokenfuse import Fuse, MemoryStore, VelocityPolicy
from tokenfuse._stores.redis import RedisStore

ITEM = parse("1000000000/minute")  # never refuses: we time the decision, not the refusal
POLICY = VelocityPolicy(cold_start_limit=None)


def sample(op: Callable[[], object], ops: int) -> list[float]:
    times = []
    for _ in range(ops):
        start = time.perf_counter_ns()
        op()
        times.append((time.perf_counter_ns() - start) / 1000)
    return times


async def asample(op: Callable[[], Awaitable[object]], ops: int) -> list[float]:
    times = []
    for _ in range(ops):
        start = time.perf_counter_ns()
        await op()
        times.append((time.perf_counter_ns() - start) / 1000)
    return times


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if q < 100 else max(values)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    prefix = f"bench-{uuid.uuid4().hex[:8]}"

    client = redis.Redis.from_url(args.redis)
    store = RedisStore(client, prefix=prefix)
    fuse = Fuse(store, velocity=POLICY)
    memory_fuse = Fuse(MemoryStore(), velocity=POLICY)
    limits_redis = storage.RedisStorage(args.redis)
    sliding = strategies.SlidingWindowCounterRateLimiter(limits_redis)
    moving = strategies.MovingWindowRateLimiter(limits_redis)
    limits_memory = storage.MemoryStorage()
    memory_sliding = strategies.SlidingWindowCounterRateLimiter(limits_memory)
    memory_moving = strategies.MovingWindowRateLimiter(limits_memory)

    sync_cases: dict[str, Callable[[], object]] = {
        "redis PING": client.ping,
        "RedisStore.record": lambda: store.record(f"{prefix}:k", 10, POLICY),
        "Fuse.record (RedisStore)": lambda: fuse.record("agent", 10),
        "Fuse.gate (RedisStore)": lambda: fuse.gate("agent"),
        "limits sliding-window hit (redis)": lambda: sliding.hit(ITEM, prefix, "k"),
        "limits moving-window hit (redis)": lambda: moving.hit(ITEM, prefix, "k"),
        "Fuse.record (MemoryStore)": lambda: memory_fuse.record("agent", 10),
        "limits sliding-window hit (memory)": lambda: memory_sliding.hit(ITEM, "k"),
        "limits moving-window hit (memory)": lambda: memory_moving.hit(ITEM, "k"),
    }
    results: dict[str, list[float]] = {name: [] for name in sync_cases}

    async def run_async() -> dict[str, list[float]]:
        aclient = aredis.Redis.from_url(args.redis)
        astore = RedisStore(aclient, prefix=prefix)
        afuse = Fuse(astore, velocity=POLICY)
        alimits = astrategies.SlidingWindowCounterRateLimiter(
            astorage.RedisStorage("async+" + args.redis, implementation="redispy")
        )
        cases: dict[str, Callable[[], Awaitable[object]]] = {
            "async redis PING": aclient.ping,
            "async Fuse.record (RedisStore)": lambda: afuse.arecord("agent", 10),
            "async limits sliding-window hit (redis)": lambda: alimits.hit(ITEM, prefix, "ak"),
        }
        out: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, op in cases.items():
                out[name] += await asample(op, args.ops)
        await aclient.aclose()
        return out

    for _ in range(args.rounds):
        for name, op in sync_cases.items():
            results[name] += sample(op, args.ops)
    results.update(asyncio.run(run_async()))

    print(f"{'case':42} {'median µs':>10} {'p99 µs':>10}")
    for name, values in results.items():
        print(f"{name:42} {statistics.median(values):10.1f} {p(values, 99):10.1f}")

    def ratio(a: str, b: str) -> float:
        return statistics.median(results[a]) / statistics.median(results[b])

    print()
    checks = [
        ("Fuse.record (RedisStore)", "redis PING", "<= 1.5"),
        ("Fuse.record (RedisStore)", "limits sliding-window hit (redis)", "<= 1.0"),
        ("Fuse.record (RedisStore)", "limits moving-window hit (redis)", ""),
        ("async Fuse.record (RedisStore)", "async redis PING", "<= 1.5"),
        ("async Fuse.record (RedisStore)", "async limits sliding-window hit (redis)", "<= 1.0"),
        ("Fuse.record (MemoryStore)", "limits moving-window hit (memory)", "<= 1.0"),
        ("Fuse.record (MemoryStore)", "limits sliding-window hit (memory)", ""),
    ]
    for a, b, target in checks:
        note = f"  (target {target})" if target else ""
        print(f"median {a} / {b}: {ratio(a, b):.2f}x{note}")

    memory_per_identity(client, prefix)
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
    for key in client.scan_iter(f"LIMITS:LIMITER/{prefix}*"):
        client.delete(key)


def memory_per_identity(client: redis.Redis, prefix: str) -> None:
    """Redis memory of one identity after a minute of 1M tokens/min, then after ten minutes."""
    clock = [1_767_225_600.0]
    store = RedisStore(client, prefix=f"{prefix}-mem", clock=lambda: clock[0])
    fuse = Fuse(store, velocity=VelocityPolicy(cold_start_limit=None))
    sizes = []
    for _minute in range(10):
        for _ in range(1000):  # 1,000 calls of 1,000 tokens a minute = 1M tokens/min
            fuse.record("heavy", 1000)
            clock[0] += 0.06
        keys = list(client.scan_iter(f"{prefix}-mem*"))
        sizes.append(sum(client.memory_usage(k) or 0 for k in keys))
    print(
        f"\nRedis memory per identity after 1M tokens/min: {sizes[0]} bytes after 1 min, "
        f"{sizes[-1]} bytes after 10 min (constant: {len(set(sizes)) == 1})"
    )
    for key in client.scan_iter(f"{prefix}-mem*"):
        client.delete(key)


if __name__ == "__main__":
    main()
