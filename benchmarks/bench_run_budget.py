"""What a run budget adds to a guarded call, in one run: the same call in and out of a run.

    python benchmarks/bench_run_budget.py [--redis redis://127.0.0.1:6379/15] [--calls 2000]

``FuseTransport`` over ``httpx.MockTransport`` (no sockets: what is left is the guard's own
work and its store round trips), on ``MemoryStore`` and on ``RedisStore``: outside any run,
inside one run (a reservation before the call, a settlement after), and inside two nested
runs (two reservations in one pipeline, two settlements in another). Every case is warmed up,
then they take turns call by call; what matters is the ratios printed at the end.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Callable
from typing import Any

import httpx
from harness import delete_keys, interleave, median, options, percentile, unique_prefix

from tokenfuse import Fuse, MemoryStore, RedisStore, VelocityPolicy
from tokenfuse._transport import FuseTransport
from tokenfuse.guards import run

POLICY = VelocityPolicy(cold_start_limit=None, cold_start_sustained=None)
MESSAGES = [{"role": "user", "content": "hi"}]
BODY = json.dumps({"model": "m", "max_tokens": 100, "messages": MESSAGES})
REPLY = {"object": "chat.completion", "choices": [], "usage": {"prompt_tokens": 5,
         "completion_tokens": 20, "total_tokens": 25}}  # fmt: skip

RATIOS = [
    ("in a run (MemoryStore)", "no run (MemoryStore)"),
    ("in a run (RedisStore)", "no run (RedisStore)"),
    ("in 2 nested runs (RedisStore)", "in a run (RedisStore)"),
]


def poster(fuse: Fuse) -> Callable[[], Any]:
    inner = httpx.MockTransport(lambda request: httpx.Response(200, json=REPLY))
    client = httpx.Client(transport=FuseTransport(inner, fuse=fuse))
    return lambda: client.post("https://llm.test/v1/chat/completions", content=BODY)


def in_context(call: Callable[[], Any], *run_ids: str, fuse: Fuse) -> Callable[[], Any]:
    """``call`` run in a context with these runs bound (none: a context of its own)."""
    context = contextvars.copy_context()
    runs = [run(run_id, tokens=1e15, fuse=fuse) for run_id in run_ids]
    for each in runs:
        context.run(each.__enter__)
    return lambda: context.run(call)


def main() -> None:
    parser = options(__doc__ or "")
    parser.add_argument("--calls", type=int, default=2_000)
    args = parser.parse_args()
    prefix = unique_prefix("runs")
    memory = Fuse(MemoryStore(), velocity=POLICY)
    shared = Fuse(RedisStore.from_url(args.redis, prefix=prefix), velocity=POLICY)
    cases = {
        "no run (MemoryStore)": in_context(poster(memory), fuse=memory),
        "in a run (MemoryStore)": in_context(poster(memory), "bench-run", fuse=memory),
        "no run (RedisStore)": in_context(poster(shared), fuse=shared),
        "in a run (RedisStore)": in_context(poster(shared), "bench-run", fuse=shared),
        "in 2 nested runs (RedisStore)": in_context(
            poster(shared), "bench-outer", "bench-inner", fuse=shared
        ),
    }
    try:
        times = asyncio.run(interleave(cases, args.calls))
    finally:
        delete_keys(args.redis, f"{prefix}:*")
    print(f"{'case':34s} {'p50 µs':>9s} {'p99 µs':>9s}")
    for name, spent in times.items():
        print(f"{name:34s} {median(spent):9.0f} {percentile(spent, 99):9.0f}")
    print("\nratios of medians:")
    for case, baseline in RATIOS:
        ratio = median(times[case]) / median(times[baseline])
        print(f"  {case} / {baseline}: {ratio:.2f}")


if __name__ == "__main__":
    main()
