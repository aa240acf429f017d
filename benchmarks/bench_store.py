"""Per-decision latency of the stores, side by side with redis-py PING and `limits`, in one run.

    python benchmarks/bench_store.py [--redis redis://127.0.0.1:6379/15] [--ops 3000]

Every case, sync and async, first warms up on its own, then all take turns call by call in
one loop so that machine noise hits them alike; what matters is the ratios printed at the
end, not the absolute microseconds (which depend on the machine).

Then the server's side: each script-backed case alone, with the time Redis itself spent
running it (``INFO commandstats``), and the floor that time sets. A script call can cost the
caller no less than a round trip of an empty script plus what its body adds on the server,
however little work the client does; where that floor is above a target, no client-side cut
meets it.
"""

from __future__ import annotations

import asyncio
import time

import redis
import redis.asyncio as aredis
from harness import delete_keys, interleave, median, options, percentile, unique_prefix
from limits import parse, storage, strategies
from limits.aio import storage as astorage
from limits.aio import strategies as astrategies

from tokenfuse import BucketPolicy, Fuse, MemoryStore, VelocityPolicy
from tokenfuse._middleware import CALL_VELOCITY
from tokenfuse._stores.ops import Admit, Record
from tokenfuse._stores.redis import RedisStore

ITEM = parse("1000000000/minute")  # never refuses: we time the decision, not the refusal
POLICY = VelocityPolicy(cold_start_limit=None)
BUCKET = BucketPolicy(rate=1e9, capacity=1e9)  # the middleware's decision, as bench_middleware.py

#: A PING on the asyncio client ``RedisStore.from_url`` builds (its blocking pool, timeouts and
#: retry: what the middleware's store sends on), against a plain client's.
FROM_URL_PING = "async redis PING, from_url's client"
#: The asyncio decisions on that client: each target ratio divides by a PING on a client with
#: the same options (issue 12: "same client options"), the plain client's for the store
#: given a plain ``redis.asyncio.Redis``, ``FROM_URL_PING`` for ``RedisStore.from_url``'s.
FROM_URL_RECORD = "async Fuse.record (RedisStore.from_url)"
FROM_URL_ADMIT = "async RedisStore.arun(Admit), from_url"
#: The sync decisions on ``RedisStore.from_url``'s sync client, against a PING on that client.
SYNC_FROM_URL_PING = "redis PING, from_url's client"
SYNC_FROM_URL_RECORD = "Fuse.record (RedisStore.from_url)"
SYNC_FROM_URL_RUN = "RedisStore.run(Record), from_url"

#: (case, baseline, target) for each ratio of medians reported.
RATIOS = [
    ("Fuse.record (RedisStore)", "redis PING", "<= 1.3"),
    ("RedisStore.run(Record)", "redis PING", ""),
    ("redis EVALSHA of 'return 1'", "redis PING", ""),
    (SYNC_FROM_URL_RECORD, SYNC_FROM_URL_PING, "<= 1.3"),
    (SYNC_FROM_URL_RUN, SYNC_FROM_URL_PING, ""),
    (SYNC_FROM_URL_PING, "redis PING", ""),
    ("limits sliding-window hit (redis)", "redis PING", ""),
    ("Fuse.record (RedisStore)", "limits sliding-window hit (redis)", "<= 1.0"),
    ("Fuse.record (RedisStore)", "limits moving-window hit (redis)", ""),
    ("async Fuse.record (RedisStore)", "async redis PING", "<= 1.3"),
    ("async Fuse.record (RedisStore)", "async limits sliding-window hit (redis)", "<= 1.0"),
    ("async RedisStore.arun(Admit)", "async redis PING", "<= 1.3"),
    (FROM_URL_RECORD, FROM_URL_PING, "<= 1.3"),
    (FROM_URL_ADMIT, FROM_URL_PING, "<= 1.3"),
    (FROM_URL_RECORD, "async redis PING", ""),  # against the plain client's PING
    (FROM_URL_ADMIT, "async redis PING", ""),
    (FROM_URL_PING, "async redis PING", ""),
    ("Fuse.record (MemoryStore)", "limits moving-window hit (memory)", "<= 1.0"),
    ("Fuse.record (MemoryStore)", "limits sliding-window hit (memory)", ""),
]


async def measure(url: str, prefix: str, calls: int) -> dict[str, list[float]]:
    client = redis.Redis.from_url(url)
    aclient = aredis.Redis.from_url(url)
    store = RedisStore(client, prefix=prefix)
    fuse = Fuse(store, velocity=POLICY)
    astore = RedisStore(aclient, prefix=prefix)
    afuse = Fuse(astore, velocity=POLICY)
    built = RedisStore.from_url(url, prefix=prefix, open_keys=False)
    built_fuse = Fuse(built, velocity=POLICY)
    empty = client.register_script("return 1")  # what any script call costs
    admit = Admit(f"{prefix}:a", cost=1, amount=1, velocity=CALL_VELOCITY, bucket=BUCKET)
    memory_fuse = Fuse(MemoryStore(), velocity=POLICY)
    limits_redis = storage.RedisStorage(url)
    sliding = strategies.SlidingWindowCounterRateLimiter(limits_redis)
    moving = strategies.MovingWindowRateLimiter(limits_redis)
    limits_memory = storage.MemoryStorage()
    memory_sliding = strategies.SlidingWindowCounterRateLimiter(limits_memory)
    memory_moving = strategies.MovingWindowRateLimiter(limits_memory)
    alimits = astrategies.SlidingWindowCounterRateLimiter(
        astorage.RedisStorage("async+" + url, implementation="redispy")
    )
    cases = {
        # Local cases first: the first call to Redis after local work waits for the server to
        # wake (about 10 µs more on this machine); that call is its own row, so that no
        # compared case pays it.
        "Fuse.record (MemoryStore)": lambda: memory_fuse.record("agent", 10),
        "limits sliding-window hit (memory)": lambda: memory_sliding.hit(ITEM, "k"),
        "limits moving-window hit (memory)": lambda: memory_moving.hit(ITEM, "k"),
        "redis PING, the first call after local work": client.ping,
        "redis PING": client.ping,
        "redis EVALSHA of 'return 1'": lambda: empty(keys=[f"{prefix}:e"]),
        "RedisStore.run(Record)": lambda: store.run(Record(f"{prefix}:k", 10, POLICY)),
        "Fuse.record (RedisStore)": lambda: fuse.record("agent", 10),
        "Fuse.gate (RedisStore)": lambda: fuse.gate("agent"),
        SYNC_FROM_URL_PING: built._clients.sync_client().ping,
        SYNC_FROM_URL_RUN: lambda: built.run(Record(f"{prefix}:u", 10, POLICY)),
        SYNC_FROM_URL_RECORD: lambda: built_fuse.record("agent", 10),
        "limits sliding-window hit (redis)": lambda: sliding.hit(ITEM, prefix, "k"),
        "limits moving-window hit (redis)": lambda: moving.hit(ITEM, prefix, "k"),
        # The first asyncio call after the sync ones pays a wake-up too (its own row, as above).
        "async redis PING, the first async call": aclient.ping,
        "async redis PING": aclient.ping,
        FROM_URL_PING: built._clients.async_client().ping,
        "async Fuse.record (RedisStore)": lambda: afuse.arecord("agent", 10),
        "async RedisStore.arun(Admit)": lambda: astore.arun(admit),
        FROM_URL_RECORD: lambda: built_fuse.arecord("agent", 10),
        FROM_URL_ADMIT: lambda: built.arun(admit),
        "async limits sliding-window hit (redis)": lambda: alimits.hit(ITEM, prefix, "ak"),
    }
    try:
        return await interleave(cases, calls)
    finally:
        client.close()
        await aclient.aclose()
        await built.aclose()


def report(results: dict[str, list[float]]) -> None:
    print(f"{'case':42} {'median µs':>10} {'p99 µs':>10}")
    for name, values in results.items():
        print(f"{name:42} {median(values):10.1f} {percentile(values, 99):10.1f}")
    print()
    for case, baseline, target in RATIOS:
        ratio = median(results[case]) / median(results[baseline])
        note = f"  (target {target})" if target else ""
        print(f"median {case} / {baseline}: {ratio:.2f}x{note}")


def server_time(url: str, prefix: str, calls: int, results: dict[str, list[float]]) -> None:
    """Redis's own microseconds per call of each script-backed case, and the floor they set."""
    client = redis.Redis.from_url(url)
    store = RedisStore(client, prefix=prefix, open_keys=False)
    fuse = Fuse(store, velocity=POLICY)
    empty = client.register_script("return 1")
    admit = Admit(f"{prefix}:sa", cost=1, amount=1, velocity=CALL_VELOCITY, bucket=BUCKET)
    sliding = strategies.SlidingWindowCounterRateLimiter(storage.RedisStorage(url))
    cases = {
        "redis PING": ("ping", client.ping),
        "redis EVALSHA of 'return 1'": ("evalsha", lambda: empty(keys=[f"{prefix}:se"])),
        "Fuse.record (RedisStore)": ("fcall", lambda: fuse.record("server", 10)),
        "RedisStore.run(Admit)": ("fcall", lambda: store.run(admit)),
        "limits sliding-window hit (redis)": ("evalsha", lambda: sliding.hit(ITEM, prefix, "s")),
    }
    served: dict[str, float] = {}
    print(f"\nthe server's side: each case alone, {calls:,} calls\n")
    print("| case | Redis µs per call (INFO commandstats) |")
    print("|---|---:|")
    for name, (command, call) in cases.items():
        for _ in range(100):
            call()  # warm: scripts loaded, connections open
        before = _command_stats(client, command)
        for _ in range(calls):
            call()
        after = _command_stats(client, command)
        count = after[0] - before[0]
        if count != calls:  # another client ran the same command meanwhile: no honest figure
            print(f"| {name} | (skipped: {count:,} {command} calls seen for {calls:,}) |")
            continue
        served[name] = (after[1] - before[1]) / count
        print(f"| {name} | {served[name]:.1f} |")
    store.close()
    client.close()
    needed = ("redis EVALSHA of 'return 1'", "Fuse.record (RedisStore)")
    if not all(name in served for name in needed):
        return
    # The client's own work is left out: an empty script's round trip, plus the body's time.
    floor = median(results[needed[0]]) + served[needed[1]] - served[needed[0]]
    ping = median(results["redis PING"])
    window = median(results["limits sliding-window hit (redis)"])
    print(
        f"\nfloor of Fuse.record (RedisStore): {floor:.1f} µs = {floor / ping:.2f}x redis PING "
        f"(target <= 1.3), {floor / window:.2f}x limits sliding-window hit (target <= 1.0)"
    )


def _command_stats(client: redis.Redis, command: str) -> tuple[int, int]:
    """(calls, microseconds) Redis has counted for ``command`` since its last reset."""
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def memory_per_identity(url: str, prefix: str) -> None:
    """Redis memory of one identity after a minute of 1M tokens/min, then after ten minutes."""
    client = redis.Redis.from_url(url)
    clock = [1_767_225_600.0]
    store = RedisStore(client, prefix=prefix, clock=lambda: clock[0])
    fuse = Fuse(store, velocity=VelocityPolicy(cold_start_limit=None))
    sizes = []
    for _minute in range(10):
        for _ in range(1000):  # 1,000 calls of 1,000 tokens a minute = 1M tokens/min
            fuse.record("heavy", 1000)
            clock[0] += 0.06
        keys = list(client.scan_iter(f"{prefix}:*"))
        sizes.append(sum(client.memory_usage(k) or 0 for k in keys))
    client.close()
    print(
        f"\nRedis memory per identity after 1M tokens/min: {sizes[0]} bytes after 1 min, "
        f"{sizes[-1]} bytes after 10 min (constant: {len(set(sizes)) == 1})"
    )


def batched_records(url: str, prefix: str, calls: int) -> None:
    """Calls recorded per second through the background recorder of one process: ``calls``
    submitted as fast as possible, then flushed; for 1 and for 100 identities."""
    from tokenfuse import Identity
    from tokenfuse._transport.meter import FuseReport, Meter, Metering
    from tokenfuse._transport.recorder import Recorder

    print("\nbatched records (FuseTransport(record='background')'s worker, one process)\n")
    print("| identities | calls | seconds | calls/s | round trips | of them inline | target |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for identities in (1, 100):
        store = RedisStore.from_url(url, prefix=f"{prefix}-batch{identities}")
        fuse = Fuse(store, velocity=POLICY)
        fuse.record("warm-up", 1)
        recorder = Recorder(fuse, max_pending=calls)  # room for all: the worker's pace, no inline
        who = [Identity.named(f"agent-{n}") for n in range(identities)]
        allowed = fuse.gate(who[0])
        metering = Metering(fuse, None, estimate=False)
        meters = []
        for n in range(calls):
            identity = who[n % identities]
            meters.append(Meter(metering, None, identity, FuseReport(identity, allowed)))
        started = time.perf_counter()
        for meter in meters:
            recorder.submit(meter, 10.0)
        assert recorder.flush(60)
        seconds = time.perf_counter() - started
        recorded = sum(fuse.status(identity).rate for identity in who) / 10
        assert recorded == calls, (recorded, calls)
        print(f"| {identities} | {calls:,} | {seconds:.2f} | {calls / seconds:,.0f} "
              f"| {recorder.counts.batches + recorder.counts.inline} "
              f"| {recorder.counts.inline} | >= 50,000 |")  # fmt: skip
        recorder.close()
        store.close()


#: The cases ``--just-calls`` runs (``benchmarks/instructions.sh sync``): sync calls on
#: ``RedisStore.from_url``'s sync client, and ("plain-") on a plain ``redis.Redis`` client
#: given to ``RedisStore`` (the first table's "redis PING" and "Fuse.record (RedisStore)").
JUST_CALLS = ("ping", "run", "record", "plain-ping", "plain-record")


def just_calls(case: str, calls: int, url: str) -> None:
    """``calls`` sync calls of one case, after 200 to warm up, and nothing else: run twice under
    callgrind (two call counts), the difference is the calls' instructions without start-up."""
    prefix = unique_prefix("calls")
    if case.startswith("plain-"):
        store = RedisStore(redis.Redis.from_url(url), prefix=prefix, open_keys=False)
    else:
        store = RedisStore.from_url(url, prefix=prefix, open_keys=False)
    fuse = Fuse(store, velocity=POLICY)
    call = {
        "ping": store._clients.sync_client().ping,
        "run": lambda: store.run(Record(f"{prefix}:k", 10, POLICY)),
        "record": lambda: fuse.record("agent", 10),
    }[case.removeprefix("plain-")]
    try:
        for _ in range(200):
            call()
        for _ in range(calls):
            call()
    finally:
        store.close()
        delete_keys(url, f"{prefix}*")


def main() -> None:
    parser = options(__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=3000, help="calls per case and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batched", type=int, default=200_000, help="calls to record batched")
    parser.add_argument(
        "--just-calls", nargs=2, metavar=("CASE", "CALLS"), help=f"only CALLS of {JUST_CALLS}"
    )
    args = parser.parse_args()
    if args.just_calls:
        case, calls = args.just_calls
        if case not in JUST_CALLS:
            parser.error(f"--just-calls: the case is one of {JUST_CALLS}")
        just_calls(case, int(calls), args.redis)
        return
    prefix = unique_prefix("store")
    try:
        results = asyncio.run(measure(args.redis, prefix, args.ops * args.rounds))
        report(results)
        server_time(args.redis, prefix, args.ops, results)
        memory_per_identity(args.redis, f"{prefix}-mem")
        batched_records(args.redis, prefix, args.batched)
    finally:
        delete_keys(args.redis, f"{prefix}*")
        delete_keys(args.redis, f"LIMITS:*{prefix}*")


if __name__ == "__main__":
    main()
