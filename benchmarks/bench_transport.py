"""What FuseTransport adds to a real HTTP call, in one run: guarded vs unguarded httpx.

    python benchmarks/bench_transport.py [--redis redis://127.0.0.1:6379/15] [--calls 2000]

A local OpenAI-compatible stub (uvicorn, in its own process so it does not share our GIL)
answers ``POST /v1/chat/completions`` with a JSON body, or with a 2,000-chunk SSE stream.
The same request goes through an unguarded ``httpx.Client`` and through ``FuseTransport`` on
``MemoryStore`` and on ``RedisStore``, interleaved call by call so that machine noise hits every
case alike. Reported: the latency percentiles of each case and what the guard adds to them
(guarded minus unguarded, same percentile), and the streaming throughput as a ratio.

    python benchmarks/bench_transport.py --in-process [--rounds 30]

measures the same two bodies over ``httpx.MockTransport`` instead: no server, no sockets, so
what is left is the CPU time the guard adds (MemoryStore), per call and per stream, without
the network's noise. Reported: the median over rounds of (guarded - unguarded), and the
difference of the fastest rounds.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from tokenfuse import Fuse, MemoryStore, VelocityPolicy
from tokenfuse._transport import FuseTransport

POLICY = VelocityPolicy(cold_start_limit=None)  # never refuses: we time the checks, not a trip
STREAM_CHUNKS = 2_000
HEADERS = {"Authorization": "Bearer sk-bench-0123456789abcdef"}

# -- the stub server ------------------------------------------------------------------------------

_BODY = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "model": "stub",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 30, "total_tokens": 42},
    }
).encode()
_EVENTS = [
    b"data: "
    + json.dumps(
        {"choices": [{"index": 0, "delta": {"content": f"t{n} "}}], "usage": None}
    ).encode()
    + b"\n\n"
    for n in range(STREAM_CHUNKS - 2)
] + [
    b'data: {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 1998, '
    b'"total_tokens": 2010}}\n\n',
    b"data: [DONE]\n\n",
]


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    stream = b'"stream": true' in body
    kind = b"text/event-stream" if stream else b"application/json"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
    if not stream:
        await send({"type": "http.response.body", "body": _BODY})
        return
    for event in _EVENTS:
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def serve(port: int) -> None:
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                lifespan="off", ws="none")  # fmt: skip


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.post(url, content=b"{}")
            return process, url
        except httpx.TransportError:
            time.sleep(0.05)
    process.kill()
    raise SystemExit("the stub server did not start")


# -- measuring ------------------------------------------------------------------------------------


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter_ns()
    call()
    return (time.perf_counter_ns() - start) / 1e6  # ms


class _Events(httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        return iter(_EVENTS)


def _mock_handler(request: httpx.Request) -> httpx.Response:
    if b'"stream": true' in request.content:
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, stream=_Events())
    headers = {"content-type": "application/json"}
    return httpx.Response(200, headers=headers, stream=httpx.ByteStream(_BODY))


def in_process(rounds: int) -> None:
    mock = httpx.MockTransport(_mock_handler)
    guarded = FuseTransport(mock, fuse=Fuse(MemoryStore(), velocity=POLICY))
    clients = {
        "unguarded": httpx.Client(headers=HEADERS, transport=mock),
        "guarded": httpx.Client(headers=HEADERS, transport=guarded),
    }
    url = "http://127.0.0.1:8000/v1/chat/completions"

    def call(client: httpx.Client) -> None:
        client.post(url, content=b'{"model": "stub"}').read()

    def stream(client: httpx.Client) -> None:
        with client.stream("POST", url, content=b'{"stream": true}') as response:
            for _ in response.iter_bytes():
                pass

    cases = {"JSON call": (call, 200), f"{STREAM_CHUNKS}-chunk SSE stream": (stream, 3)}
    print(f"\nin process (httpx.MockTransport), {rounds} interleaved rounds (us)\n")
    print("| body | unguarded | guarded | added (median of rounds) | added (fastest rounds) |")
    print("|---|---:|---:|---:|---:|")
    for name, (run, batch) in cases.items():
        for client in clients.values():  # warm up
            for _ in range(batch * 5):
                run(client)
        times: dict[str, list[float]] = {case: [] for case in clients}
        for _ in range(rounds):
            for case, client in clients.items():
                start = time.perf_counter_ns()
                for _ in range(batch):
                    run(client)
                times[case].append((time.perf_counter_ns() - start) / batch / 1e3)
        plain, guard = times["unguarded"], times["guarded"]
        added = statistics.median(g - p for g, p in zip(guard, plain, strict=True))
        print(
            f"| {name} | {statistics.median(plain):,.1f} | {statistics.median(guard):,.1f} "
            f"| {added:+,.1f} | {min(guard) - min(plain):+,.1f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument("--streams", type=int, default=30)
    parser.add_argument("--in-process", action="store_true")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.in_process:
        in_process(args.rounds)
        return

    process, url = start_server()
    clients: dict[str, httpx.Client] = {"unguarded": httpx.Client(headers=HEADERS)}
    memory = Fuse(MemoryStore(), velocity=POLICY)
    clients["MemoryStore"] = httpx.Client(headers=HEADERS, transport=FuseTransport(fuse=memory))
    try:
        from tokenfuse._stores.redis import RedisStore

        store = RedisStore.from_url(args.redis)
        redis_fuse = Fuse(store, velocity=POLICY, name=f"bench-{uuid.uuid4().hex[:8]}")
        redis_fuse.gate("probe")
        if redis_fuse.gate("probe").degraded:
            raise ConnectionError(f"no Redis at {args.redis}")
        clients["RedisStore"] = httpx.Client(
            headers=HEADERS, transport=FuseTransport(fuse=redis_fuse)
        )
    except Exception as exc:  # report the other rows anyway
        print(f"(RedisStore rows skipped: {exc})")

    def call(client: httpx.Client) -> Callable[[], object]:
        return lambda: client.post(url, content=b'{"model": "stub"}').content

    def stream(client: httpx.Client) -> Callable[[], object]:
        def read() -> None:
            with client.stream("POST", url, content=b'{"stream": true}') as response:
                for _ in response.iter_bytes():
                    pass

        return read

    try:
        for client in clients.values():  # warm up connections, imports, caches
            for _ in range(200):
                call(client)()
            stream(client)()
        latency: dict[str, list[float]] = {name: [] for name in clients}
        for _ in range(args.calls):
            for name, client in clients.items():
                latency[name].append(timed(call(client)))
        throughput: dict[str, list[float]] = {name: [] for name in clients}
        for _ in range(args.streams):
            for name, client in clients.items():
                throughput[name].append(STREAM_CHUNKS / timed(stream(client)) * 1000)
    finally:
        process.terminate()
        process.wait()

    base = latency["unguarded"]
    print(f"\nnon-streaming chat completion, {args.calls} calls per case (ms)\n")
    print("| case | p50 | p99 | added p50 | added p99 |")
    print("|---|---:|---:|---:|---:|")
    for name, values in latency.items():
        added = (
            ("", "")
            if name == "unguarded"
            else (
                f"{pct(values, 50) - pct(base, 50):+.3f}",
                f"{pct(values, 99) - pct(base, 99):+.3f}",
            )
        )
        print(
            f"| {name} | {pct(values, 50):.3f} | {pct(values, 99):.3f} | {added[0]} | {added[1]} |"
        )
    plain = statistics.median(throughput["unguarded"])
    print(f"\n{STREAM_CHUNKS}-chunk SSE stream, {args.streams} streams per case (chunks/s)\n")
    print("| case | median chunks/s | vs unguarded |")
    print("|---|---:|---:|")
    for name, values in throughput.items():
        median = statistics.median(values)
        print(f"| {name} | {median:,.0f} | {median / plain:.2f}x |")


if __name__ == "__main__":
    main()
