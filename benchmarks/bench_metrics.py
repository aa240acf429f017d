"""What metrics add to a guarded call: the same calls with and without observers, interleaved.

    python benchmarks/bench_metrics.py [--redis redis://127.0.0.1:6379/15] [--calls 5000]

Each pair of cases runs the same decision (or transport call over ``httpx.MockTransport``)
with no observer installed, and with the Prometheus ``Tally`` installed (for the transport,
also with the OpenTelemetry histogram on an SDK meter provider, whose own cost it shows). The
observers are switched per call, so both sides of a pair take turns call by call (half the
calls in each order); the difference of the medians is the cost of metrics on the hot path.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
from harness import delete_keys, interleave, median, options, percentile, unique_prefix
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from tokenfuse import FREE, Fuse, FuseTransport, MemoryStore, VelocityPolicy
from tokenfuse._metrics.otel import GenAITokenUsage
from tokenfuse._observe import WATCHERS
from tokenfuse.metrics import Tally
from tokenfuse.stores import RedisStore

POLICY = VelocityPolicy(cold_start_limit=None)  # never trips: we time the decision
BODY = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})


def with_observers(
    decisions: tuple[Any, ...], usage: tuple[Any, ...], call: Callable[[], object]
) -> Callable[[], object]:
    def case() -> object:
        WATCHERS.decisions, WATCHERS.usage = decisions, usage
        return call()

    return case


def llm(request: httpx.Request) -> httpx.Response:
    usage = {"prompt_tokens": 1_000, "completion_tokens": 200}
    return httpx.Response(200, json={"model": "gpt-4o-mini", "usage": usage})


async def measure(url: str, prefix: str, calls: int) -> dict[str, list[float]]:
    tally = Tally()
    otel = GenAITokenUsage(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    memory = Fuse(MemoryStore(), velocity=POLICY)
    inbound = Fuse(MemoryStore(), name="inbound", velocity=None, bucket=FREE)
    redis_store = RedisStore.from_url(url, prefix=prefix)
    redis_fuse = Fuse(redis_store, velocity=POLICY)
    client = httpx.Client(
        transport=FuseTransport(
            httpx.MockTransport(llm), fuse=Fuse(MemoryStore(), velocity=POLICY)
        ),
        headers={"authorization": "Bearer sk-bench-0123456789abcdef"},
    )

    def post() -> object:
        return client.post("https://api.openai.com/v1/chat/completions", content=BODY)

    prometheus = ((tally,), (tally,))
    both = ((tally,), (tally, otel))
    pairs = [
        ("Fuse.record (MemoryStore)", lambda: memory.record("agent", 10), prometheus),
        ("Fuse.admit (MemoryStore, bucket)", lambda: inbound.admit("caller"), prometheus),
        ("FuseTransport call (MemoryStore, MockTransport), Prometheus", post, prometheus),
        ("FuseTransport call (MemoryStore, MockTransport), + OTel SDK", post, both),
        ("Fuse.record (RedisStore)", lambda: redis_fuse.record("agent", 10), prometheus),
    ]
    times: dict[str, list[float]] = {}
    try:
        # Each pair on its own, once in each order: the case that runs right after the other
        # one pays for what that one left behind (caches, the allocator), whichever it is.
        for name, call, (decisions, usage) in pairs:
            off = (f"{name}, no metrics", with_observers((), (), call))
            on = (f"{name}, metrics", with_observers(decisions, usage, call))
            for order in ((off, on), (on, off)):
                for case, spent in (await interleave(dict(order), calls // 2)).items():
                    times.setdefault(case, []).extend(spent)
        return times
    finally:
        WATCHERS.decisions, WATCHERS.usage = (), ()
        client.close()
        redis_store.close()


def report(results: dict[str, list[float]]) -> None:
    print(f"{'case':76} {'median µs':>10} {'p99 µs':>10}")
    for name, values in results.items():
        print(f"{name:76} {median(values):10.2f} {percentile(values, 99):10.2f}")
    print()
    names = [name.removesuffix(", no metrics") for name in results if name.endswith("no metrics")]
    for name in names:
        off, on = median(results[f"{name}, no metrics"]), median(results[f"{name}, metrics"])
        print(f"{name:62} metrics add {on - off:+6.2f} µs median ({on / off - 1:+.1%})")


def main() -> None:
    parser = options(__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5_000, help="calls per case")
    args = parser.parse_args()
    prefix = unique_prefix("metrics")
    try:
        report(asyncio.run(measure(args.redis, prefix, args.calls)))
    finally:
        delete_keys(args.redis, f"{prefix}*")


if __name__ == "__main__":
    main()
