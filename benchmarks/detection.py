"""How fast the velocity check refuses loops, and how often it refuses normal traffic.

    python benchmarks/detection.py [--quick] [--only TEXT] [--throughput-keys 100]

Replays every scenario of ``detection_scenarios.py`` through ``Fuse(MemoryStore(clock=...))``
on a simulated clock (gate before each call, record after it) and prints one Markdown row per
scenario and loop phase: the time from the loop's start to the first refused call, the tokens
the loop spent until then, and the trips of the key's normal traffic (false trips) over the
days replayed. ``--quick`` replays 7 days instead of 30 for the normal profiles.

Then a throughput case: 30 days of synthetic production traffic for 100 keys of sizes spread
from 100 to 10,000 tokens/min, through one fuse, timed without the traffic's generation.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import logging
import math
import random
import statistics
import time
import tracemalloc

from detection_scenarios import (
    DAY,
    START,
    Outcome,
    Scenario,
    SimClock,
    production,
    replay,
    scenarios,
)

from tokenfuse import Fuse, MemoryStore


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "never"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3_600:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * DAY:
        return f"{seconds / 3_600:.1f} h"
    return f"{seconds / DAY:.1f} days"


def _tokens(amount: float) -> str:
    if amount >= 1e6:
        return f"{amount / 1e6:,.1f}M"
    if amount >= 1e4:
        return f"{amount / 1e3:,.0f}k"
    return f"{amount:,.0f}"


def rows(scenario: Scenario, out: Outcome, seconds: float) -> list[str]:
    """The table's lines for one replay: one per loop phase, or one for a normal profile."""
    trips = f"{out.false_trips}"
    if scenario.forgive:
        forgiven = "no forgive" if out.forgiven_at is None else f"{out.trips_after_forgive} after"
        trips = f"{len(out.trips)} ({forgiven})"
    days = (scenario.loops[0][0] if scenario.loops else scenario.days * DAY) / DAY
    trips += f" in {days:.1f} d" if days else ""
    if not scenario.loops:
        return [f"| {scenario.name} | — | — | {trips} | {seconds:.1f} s |"]
    lines = []
    for phase, (start, end) in enumerate(scenario.loops, 1):
        name = scenario.name if len(scenario.loops) == 1 else f"{scenario.name}: phase {phase}"
        if phase in out.refused:
            when = _duration(out.refused[phase] - start)
        else:
            when = f"never ({_duration(end - start)})"
        spent = _tokens(out.spent.get(phase, 0.0))
        lines.append(f"| {name} | {when} | {spent} | {trips} | {seconds:.1f} s |")
    return lines


def throughput(keys: int, days: float, seed: int = 7) -> str:
    """Decisions per second of one MemoryStore fuse over many keys' merged traffic."""
    rng = random.Random(seed)
    sizes = [100 * 100 ** (i / max(keys - 1, 1)) for i in range(keys)]  # 100 .. 10,000 /min
    streams = [
        ((t, amount, f"key-{i}") for t, amount, _ in production(rng, 0.0, days * DAY, size))
        for i, size in enumerate(sizes)
    ]
    calls = list(heapq.merge(*streams, key=lambda call: call[0]))
    clock = SimClock()
    fuse = Fuse(MemoryStore(clock=clock))
    decisions = trips = 0
    started = time.perf_counter()
    for t, amount, key in calls:
        clock.now = START + t
        decisions += 1
        if fuse.gate(key).allowed:
            decisions += 1
            trips += fuse.record(key, amount).tripped
    elapsed = time.perf_counter() - started
    return (
        f"{keys} keys x {days:.0f} days: {len(calls):,} calls, {decisions:,} decisions in "
        f"{elapsed:.1f} s = {decisions / elapsed:,.0f} decisions/s ({trips} trips)"
    )


def state_size(keys: int = 2_000) -> str:
    """Bytes per identity: the packed string in Redis, and what MemoryStore holds (measured
    with tracemalloc over ``keys`` identities that each recorded 30 calls)."""
    clock = SimClock()
    store = MemoryStore(clock=clock)
    fuse = Fuse(store)
    rng = random.Random(1)
    names = [f"key-{i}" for i in range(keys)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for name in names:
        for _ in range(30):
            clock.now += rng.random() * 7
            fuse.record(name, rng.random() * 1_000 + 1)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    held = sum(stat.size_diff for stat in after.compare_to(before, "filename")) / keys
    try:
        from tokenfuse._stores.redis_codec import VELOCITY_BLOCK

        packed = f"{VELOCITY_BLOCK.size} bytes packed in Redis (velocity block), "
    except ImportError:  # no redis-py
        packed = ""
    return f"state per identity: {packed}{held:,.0f} bytes in MemoryStore (entry included)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="7 days for the normal profiles")
    parser.add_argument("--only", default="", help="only scenarios whose name contains this")
    parser.add_argument("--throughput-keys", type=int, default=100)
    parser.add_argument("--throughput-days", type=float, default=30.0)
    args = parser.parse_args()
    logging.getLogger("tokenfuse").addHandler(logging.NullHandler())  # trips are counted here
    logging.getLogger("tokenfuse").propagate = False
    print(
        "| scenario | first refusal after the loop starts | loop tokens before it "
        "| false trips | replay |"
    )
    print("|---|---|---|---|---|")
    groups: dict[str, list[float]] = {}
    for scenario in scenarios(quick=args.quick):
        if args.only not in scenario.name:
            continue
        started = time.perf_counter()
        out = replay(scenario)
        seconds = time.perf_counter() - started
        for line in rows(scenario, out, seconds):
            print(line, flush=True)
        if scenario.group == "production loop":
            loop_start = scenario.loops[0][0]
            groups.setdefault(scenario.name.rsplit(" #", 1)[0], []).append(
                out.refused.get(1, math.inf) - loop_start
            )
    for name, times in groups.items():
        finite = [t for t in times if math.isfinite(t)]
        median = statistics.median(times)
        print(f"{name}: refused {len(finite)}/{len(times)}, median {_duration(median)}")
    if args.throughput_keys and not args.only:
        print()
        print(state_size())
        print(throughput(args.throughput_keys, args.throughput_days))


if __name__ == "__main__":
    main()
