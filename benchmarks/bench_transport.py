"""What FuseTransport adds to a real HTTP call, in one run: guarded vs unguarded httpx.

    python benchmarks/bench_transport.py [--redis redis://127.0.0.1:6379/15] [--calls 2000]

A local OpenAI-compatible stub (uvicorn, in its own process so it does not share our GIL)
answers ``POST /v1/chat/completions`` with a JSON body, or with a 2,000-chunk SSE stream.
The same request goes through an unguarded ``httpx.Client`` and through ``FuseTransport`` on
``MemoryStore`` and on ``RedisStore``, each warmed up, then taking turns call by call so that
machine noise hits every case alike. Reported: the latency percentiles of each case and what
the guard adds to them (guarded minus unguarded, same percentile), and the streaming
throughput as a ratio.

    python benchmarks/bench_transport.py --in-process [--rounds 30] [--no-redis]

measures the same two bodies over ``httpx.MockTransport`` instead: no server, no sockets, so
what is left is the CPU time each guard adds, per call and per stream, without the network's
noise: MemoryStore, and RedisStore with its open-key view and background records (its gate
answered locally, its records batched by a worker thread that shares the GIL). Reported: the
median over rounds of (guarded - unguarded), the difference of the fastest rounds, the
ratio of each guard's added time to MemoryStore's, and each case's speed vs unguarded.

What the in-process stream row measures: 2,000 events of about 80 bytes (160 KB), already in
memory, handed on by httpx's generators. Unguarded, that is one short loop run 2,000 times,
which the CPU runs at 11 to 13 instructions a nanosecond (callgrind's count over the time):
about 0.4-0.5 us a chunk. The guard adds a third to the instructions (``instructions.sh``) and
60 to 90% to the time, because its instructions run at the rate
of ordinary code (4 to 6 a nanosecond, as the JSON call's added instructions do). Over a third
of them are C-level byte searches, each a pass over the body: "error" (shared by the usage
reader and the loop watch), the usage key and its null form (counted by the reader) and
"response.failed" (the watch), some 250 us a stream at 0.3-0.6 ns a byte each. Nothing else
takes time there: no system call, thread, log line or copy that grows with the stream. Over
loopback HTTP, where each chunk costs the client a socket read, the same guard keeps streams
at 0.95x or better.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
from harness import delete_keys, interleave, median, options, percentile, unique_prefix

from tokenfuse import Fuse, MemoryStore, VelocityPolicy
from tokenfuse._transport import FailureLoopPolicy, FuseTransport

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


def chat(client: httpx.Client, url: str) -> None:
    """One chat completion, its JSON body read to the end."""
    client.post(url, content=b'{"model": "stub"}').read()


def chat_stream(client: httpx.Client, url: str) -> None:
    """One streamed chat completion, read chunk by chunk to the end."""
    with client.stream("POST", url, content=b'{"stream": true}') as response:
        for _ in response.iter_bytes():
            pass


class _Events(httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        return iter(_EVENTS)


def _mock_handler(request: httpx.Request) -> httpx.Response:
    if b'"stream": true' in request.content:
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, stream=_Events())
    headers = {"content-type": "application/json"}
    return httpx.Response(200, headers=headers, stream=httpx.ByteStream(_BODY))


class _PassedOn(httpx.SyncByteStream):
    """A stream handed on chunk by chunk, doing nothing else: one Python generator step per
    chunk, the least a guard that reads a stream's usage as it passes can cost."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._inner:  # noqa: UP028 (a guard sees each chunk: no yield from)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class _PassOn(httpx.BaseTransport):
    """The floor of a guard: a transport that wraps the response's stream and does nothing."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self._inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self._inner.handle_request(request)
        response.stream = _PassedOn(response.stream)
        return response


#: The floor row of the in-process table.
FLOOR = "(floor) a transport that only hands each chunk on"


def in_process(rounds: int, redis_url: str | None) -> None:
    """Unguarded, MemoryStore and (with ``redis_url``) RedisStore with its open-key view and
    background records, over one mock transport: the CPU each guard adds to a call."""
    mock = httpx.MockTransport(_mock_handler)
    guarded = FuseTransport(mock, fuse=Fuse(MemoryStore(), velocity=POLICY))
    no_loops = FuseTransport(mock, fuse=Fuse(MemoryStore(), velocity=POLICY), failure_loops=None)
    clients = {
        "unguarded": httpx.Client(headers=HEADERS, transport=mock),
        "MemoryStore": httpx.Client(headers=HEADERS, transport=guarded),
        GUARDED_NO_LOOPS: httpx.Client(headers=HEADERS, transport=no_loops),
        FLOOR: httpx.Client(headers=HEADERS, transport=_PassOn(mock)),
    }
    fuse_name = unique_prefix("transport")
    if redis_url is not None:
        from tokenfuse._stores.redis import RedisStore

        store = RedisStore.from_url(redis_url)
        redis_fuse = Fuse(store, velocity=POLICY, name=fuse_name)
        synced = store.open_keys is not None and store.open_keys.wait_synced(10)
        if redis_fuse.record("probe", 1).degraded or not synced:
            print(f"(RedisStore row skipped: no Redis, or no open-key view, at {redis_url})")
        else:
            transport = FuseTransport(mock, fuse=redis_fuse, record="background")
            clients[REDIS_IN_PROCESS] = httpx.Client(headers=HEADERS, transport=transport)
            bare = FuseTransport(mock, fuse=redis_fuse, record="background", failure_loops=None)
            clients[f"{REDIS_IN_PROCESS}, {NO_LOOPS}"] = httpx.Client(
                headers=HEADERS, transport=bare
            )
    url = "http://127.0.0.1:8000/v1/chat/completions"

    cases = {"JSON call": (chat, 200), f"{STREAM_CHUNKS}-chunk SSE stream": (chat_stream, 3)}
    print(f"\nin process (httpx.MockTransport), {rounds} interleaved rounds (us per call)\n")
    print("| body | case | median | added (median of rounds) | added (fastest rounds) "
          "| added / MemoryStore's | vs unguarded |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|")
    try:
        for name, (run, batch) in cases.items():

            def batch_of(client: httpx.Client, run: Any = run, batch: int = batch) -> None:
                for _ in range(batch):
                    run(client, url)

            batches = {case: (lambda c=client: batch_of(c)) for case, client in clients.items()}
            times = asyncio.run(interleave(batches, rounds, warmup=5))
            per_call = {case: [us / batch for us in values] for case, values in times.items()}
            report_in_process(name, per_call)
    finally:
        for client in clients.values():
            client.close()  # flushes the background records
        if redis_url is not None:
            delete_keys(redis_url, f"tokenfuse:{{{fuse_name}:*")


REDIS_IN_PROCESS = "RedisStore, open-key view, background record"


def report_in_process(body: str, per_call: dict[str, list[float]]) -> None:
    """Each case's added time, and its ratio to MemoryStore's with the same breaker setting."""
    plain = per_call["unguarded"]
    added_by_case = {
        case: median([g - p for g, p in zip(values, plain, strict=True)])
        for case, values in per_call.items()
    }
    for case, values in per_call.items():
        if case == "unguarded":
            print(f"| {body} | {case} | {median(values):,.1f} | | | | 1.00x |")
            continue
        added = added_by_case[case]
        memory_added = added_by_case[GUARDED_NO_LOOPS if NO_LOOPS in case else "MemoryStore"]
        ratio = f"{added / memory_added:.2f}x" if memory_added > 0 and case != FLOOR else ""
        speed = median(plain) / median(values)
        print(
            f"| {body} | {case} | {median(values):,.1f} | {added:+,.1f} "
            f"| {min(values) - min(plain):+,.1f} | {ratio} | {speed:.2f}x |"
        )


def just_calls(case: str, body: str, calls: int) -> None:
    """``calls`` calls of one case over the mock transport, untimed: what
    ``benchmarks/instructions.sh`` runs under callgrind to count instructions per call."""
    mock = httpx.MockTransport(_mock_handler)
    transport: Any = mock
    if case != "unguarded":  # guarded, or guarded-no-loops (failure_loops=None)
        loops = {"failure_loops": None} if case == "guarded-no-loops" else {}
        transport = FuseTransport(mock, fuse=Fuse(MemoryStore(), velocity=POLICY), **loops)
    client = httpx.Client(headers=HEADERS, transport=transport)
    run = chat if body == "json" else chat_stream
    url = "http://127.0.0.1:8000/v1/chat/completions"
    for _ in range(20):  # warm: caches filled, every lazy import done
        run(client, url)
    # The start-up's objects out of the collector's way: its full passes over them would
    # fall unevenly between the FEW and MANY runs that instructions.sh subtracts.
    gc.collect()
    gc.freeze()
    for _ in range(calls):
        run(client, url)


#: The same guard with the failure-loop breaker off: what the breaker's step costs.
NO_LOOPS = "failure_loops=None"
GUARDED_NO_LOOPS = f"MemoryStore, {NO_LOOPS}"


#: The RedisStore cases: (label, open-key view, how usage is recorded, failure-loop breaker).
REDIS_CASES = [
    ("RedisStore, round-trip gate", False, "inline", True),
    ("RedisStore, open-key view", True, "inline", True),
    ("RedisStore, open-key view, failure_loops=None", True, "inline", False),
    ("RedisStore, open-key view, background record", True, "background", True),
]


def guarded_clients(redis_url: str, fuse_name: str) -> dict[str, httpx.Client]:
    """An unguarded client, then one guarded on each store (Redis left out if unreachable)."""
    clients: dict[str, httpx.Client] = {"unguarded": httpx.Client(headers=HEADERS)}
    memory = Fuse(MemoryStore(), velocity=POLICY)
    clients["MemoryStore"] = httpx.Client(headers=HEADERS, transport=FuseTransport(fuse=memory))
    plain = FuseTransport(fuse=Fuse(MemoryStore(), velocity=POLICY), failure_loops=None)
    clients["MemoryStore, failure_loops=None"] = httpx.Client(headers=HEADERS, transport=plain)
    try:
        from tokenfuse._stores.redis import RedisStore

        for label, view, record, loops in REDIS_CASES:
            store = RedisStore.from_url(redis_url, open_keys=view)
            redis_fuse = Fuse(store, velocity=POLICY, name=fuse_name)
            if redis_fuse.record("probe", 1).degraded:
                raise ConnectionError(f"no Redis at {redis_url}")
            if store.open_keys is not None and not store.open_keys.wait_synced(10):
                raise ConnectionError("the open-key view did not sync")
            transport = FuseTransport(
                fuse=redis_fuse,
                record=record,  # type: ignore[arg-type]
                failure_loops=FailureLoopPolicy() if loops else None,
            )
            clients[label] = httpx.Client(headers=HEADERS, transport=transport)
    except Exception as exc:  # report the other rows anyway
        print(f"(RedisStore rows skipped: {exc})")
    return clients


def over_the_network(redis_url: str, calls: int, streams: int) -> None:
    process, url = start_server()
    fuse_name = unique_prefix("transport")
    clients = guarded_clients(redis_url, fuse_name)

    try:
        latency = asyncio.run(
            interleave({case: (lambda c=c: chat(c, url)) for case, c in clients.items()}, calls)
        )
        stream_us = asyncio.run(
            interleave(
                {case: (lambda c=c: chat_stream(c, url)) for case, c in clients.items()},
                streams,
                warmup=1,
            )
        )
    finally:
        for client in clients.values():
            client.close()  # flushes the background records
        process.terminate()
        process.wait()
        delete_keys(redis_url, f"tokenfuse:{{{fuse_name}:*")
        delete_keys(redis_url, f"tokenfuse:loops:{{{fuse_name}:*")
    report_latency({case: [us / 1000 for us in values] for case, values in latency.items()})
    report_throughput(
        {case: [STREAM_CHUNKS / us * 1e6 for us in values] for case, values in stream_us.items()}
    )


def report_latency(latency: dict[str, list[float]]) -> None:
    base = latency["unguarded"]
    print(f"\nnon-streaming chat completion, {len(base)} calls per case (ms)\n")
    print("| case | p50 | p99 | added p50 | added p99 | added p50 / MemoryStore's |")
    print("|---|---:|---:|---:|---:|---:|")
    memory_added = percentile(latency["MemoryStore"], 50) - percentile(base, 50)
    for case, values in latency.items():
        p50, p99 = percentile(values, 50), percentile(values, 99)
        added = " | | "
        if case != "unguarded":
            p50_added = p50 - percentile(base, 50)
            ratio = f"{p50_added / memory_added:.2f}x" if memory_added > 0 else "n/a"
            added = f"{p50_added:+.3f} | {p99 - percentile(base, 99):+.3f} | {ratio}"
        print(f"| {case} | {p50:.3f} | {p99:.3f} | {added} |")


def report_throughput(throughput: dict[str, list[float]]) -> None:
    plain = median(throughput["unguarded"])
    streams = len(throughput["unguarded"])
    print(f"\n{STREAM_CHUNKS}-chunk SSE stream, {streams} streams per case (chunks/s)\n")
    print("| case | median chunks/s | vs unguarded |")
    print("|---|---:|---:|")
    for case, values in throughput.items():
        chunks = median(values)
        print(f"| {case} | {chunks:,.0f} | {chunks / plain:.2f}x |")


def main() -> None:
    parser = options(__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument("--streams", type=int, default=30)
    parser.add_argument("--in-process", action="store_true")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--no-redis", action="store_true", help="--in-process: MemoryStore only")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--just-calls",
        nargs=3,
        metavar=("CASE", "BODY", "CALLS"),
        help="unguarded|guarded|guarded-no-loops json|stream N: N untimed calls",
    )
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
    elif args.just_calls:
        case, body, calls = args.just_calls
        just_calls(case, body, int(calls))
    elif args.in_process:
        in_process(args.rounds, None if args.no_redis else args.redis)
    else:
        over_the_network(args.redis, args.calls, args.streams)


if __name__ == "__main__":
    main()
