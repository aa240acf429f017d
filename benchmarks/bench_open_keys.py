"""How long a trip in one process takes to be refused by another's gate, with no round trip.

    python benchmarks/bench_open_keys.py [--redis redis://127.0.0.1:6379/15] [--trips 200]
        [--loops]

Two real processes on one Redis. The *watcher* gates a key in a tight loop on its own
``RedisStore`` (its open-key view synced, so each gate is answered locally); the *tripper*
(this process) trips that key with one record and notes the time, just before sending it.
The watcher notes when its gate first refuses. Both read ``time.monotonic()``, one clock
for every process on Linux. Each round uses a new key. Reported: the delay from sending the
trip to the watcher's refusal (median, p99, max, in ms; the target is <= 50 ms), and how many
of the watcher's gates were answered locally.

``--loops``: the same for the failure-loop breaker's trips. The watcher checks one call in a
tight loop (``CheckLoops(local=True)``, as the middleware in lease mode does); the tripper
notes two failures of that call, then the third, which trips it, timed from just before it.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import time
from typing import Any

from harness import delete_keys, median, options, percentile, unique_prefix

from tokenfuse import Fuse, VelocityPolicy
from tokenfuse._core.loops import LoopPolicy
from tokenfuse._stores.ops import CheckLoops, NoteLoop
from tokenfuse._stores.redis import RedisStore

POLICY = VelocityPolicy(limit=100, cooldown=600)
LOOPS = LoopPolicy(failures=3, cooldown=600, cooldown_max=600)
CALL = "0123456789abcdef"
GIVE_UP = 2.0  # seconds a watcher waits for one trip before reporting it as missed


def watcher(
    url: str, prefix: str, trips: int, loops: bool, ready: Any, keys: Any, seen: Any
) -> None:
    store = RedisStore.from_url(url, prefix=prefix)
    fuse = Fuse(store, velocity=POLICY)

    def allowed(key: str) -> bool:
        if loops:
            return store.run(CheckLoops(key, CALL, LOOPS, local=True)).allowed
        return fuse.gate(key).allowed

    view = store.open_keys
    assert view is not None
    if not view.wait_synced(10):
        raise SystemExit("the watcher's view did not sync")
    ready.set()
    for _ in range(trips):
        key = keys.get()
        deadline = time.monotonic() + GIVE_UP
        refused_at = float("nan")
        while time.monotonic() < deadline:  # bounded: a trip that never arrives is reported
            if not allowed(key):
                refused_at = time.monotonic()
                break
        seen.put(refused_at)
    if loops:
        seen.put((view.counts.loop_local, view.counts.loop_round_trips, view.counts.lost))
    else:
        seen.put((view.counts.local, view.counts.round_trips, view.counts.lost))
    store.close()


def measure(url: str, trips: int, loops: bool) -> tuple[list[float], tuple[int, int, int]]:
    prefix = unique_prefix("open-keys")
    context = multiprocessing.get_context("spawn")
    ready, keys, seen = context.Event(), context.Queue(), context.Queue()
    process = context.Process(target=watcher, args=(url, prefix, trips, loops, ready, keys, seen))
    process.start()
    store = RedisStore.from_url(url, prefix=prefix, open_keys=False)
    fuse = Fuse(store, velocity=POLICY)
    delays = []
    try:
        if not ready.wait(30):
            raise SystemExit("the watcher did not start")
        for round_ in range(trips):
            key = f"k{round_}"
            keys.put(key)
            time.sleep(0.005)  # let the watcher start gating the new key
            if loops:
                for _ in range(LOOPS.failures - 1):
                    store.run(NoteLoop(key, CALL, LOOPS, True, 500))
                sent = time.monotonic()
                assert store.run(NoteLoop(key, CALL, LOOPS, True, 500)).tripped
            else:
                sent = time.monotonic()
                assert fuse.record(key, 500).tripped
            delays.append((seen.get(timeout=30) - sent) * 1000)
        counts = seen.get(timeout=30)
    finally:
        process.join(30)
        store.close()
        delete_keys(url, f"{prefix}:*")
    return delays, counts


def main() -> None:
    logging.getLogger("tokenfuse").setLevel(logging.ERROR)  # each round trips on purpose
    parser: argparse.ArgumentParser = options(__doc__.splitlines()[0])
    parser.add_argument("--trips", type=int, default=200)
    parser.add_argument("--loops", action="store_true", help="the failure-loop breaker's trips")
    args = parser.parse_args()
    delays, (local, round_trips, lost) = measure(args.redis, args.trips, args.loops)
    missed = sum(delay != delay for delay in delays)
    found = [delay for delay in delays if delay == delay]
    what = "loop trips (a call's third failure)" if args.loops else "trips (a key's latch)"
    print(f"{len(delays)} {what}, {missed} not refused within {GIVE_UP} s")
    print("trip in process A -> first refusal in process B (ms)\n")
    print("| median | p99 | max | target |")
    print("|---:|---:|---:|---:|")
    print(f"| {median(found):.2f} | {percentile(found, 99):.2f} | {max(found):.2f} | <= 50 |")
    print(f"\nwatcher checks answered locally: {local:,}; round trips: {round_trips}; "
          f"subscriptions lost: {lost}")  # fmt: skip


if __name__ == "__main__":
    main()
