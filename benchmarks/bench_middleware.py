"""Added latency per request of TokenFuse, side by side with slowapi, in one run.

    python benchmarks/bench_middleware.py [--redis redis://127.0.0.1:6379/15] [--requests 2000]
        [--rounds 5]

A trivial Starlette endpoint, bare and behind each limiter, is called in-process as an ASGI
app (no sockets between client and app, so the figures are the middleware's own cost plus its
store round trip). Both limiters guard every route for the caller named by its bearer token,
with a limit no request reaches (we time the decision, not the refusal), both add their rate
limit headers, and each uses memory or Redis storage:

* TokenFuse: ``inbound_fuse(store)`` with a bucket of 10^9 (on Redis, one script call per
  request: the ``Admit`` script, the failure-loop breaker's ``CheckLoops`` answered by the
  store's open-key view once it is synced, and sent in one pipeline with ``Admit`` before);
  and on Redis in lease mode (``lease=True``: calls admitted from a slice of the bucket this
  process leases, one script call per lease of up to 100 calls; the breaker's check answered
  by the store's open-key view, and lease mode timed without the breaker too).
* slowapi: ``SlowAPIASGIMiddleware`` with ``default_limits=["1000000000/minute"]`` and
  ``headers_enabled=True``, on the ``limits`` memory or Redis storage (fixed window, slowapi's
  default strategy).

Reference rows time what no Redis-backed limiter can go below on this machine: a
``redis.asyncio`` PING, and the ``RedisStore.arun(Admit(...))`` call the middleware makes; and
a lease renewal recording the 100 calls its lease admitted (the store's time per call in
lease mode is a hundredth of it). The PING that the targets divide by comes right after the
apps' local work, as the middleware's own call does, and so pays the server's wake-up; a
second PING, right after another call, shows the ratio without it. Two more rows are the
floor of direct mode: the ``Admit`` function's FCALL alone (EVALSHA where the server runs no
functions), and with ``CheckLoops`` in one round trip, each sent bare (its arguments encoded
once, its reply not read into a verdict): what the scripts and redis-py cost with nothing of
tokenfuse around them.

Every case first warms up on its own, then all take turns request by request so that machine
noise hits them alike. The figures that matter are the p50 *added* to the bare endpoint and
the ratio between the limiters. Each request is timed twice: the whole ASGI call, and until
its response's last body message is sent, which is what the caller waits for (an ASGI
server finishes the response there; what runs after it, such as the failure-loop breaker's
note of the call, holds the server's task but not the caller).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from harness import delete_keys, interleave, options, percentile, unique_prefix
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from tokenfuse import BucketPolicy, Identity, MemoryStore
from tokenfuse._loops import FailureLoopPolicy
from tokenfuse._middleware import CALL_VELOCITY, TokenFuse, inbound_fuse
from tokenfuse._stores.ops import Admit, CheckLoops, Lease
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_batch import asend_all

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]
LIMIT = "1000000000/minute"
BUCKET = BucketPolicy(rate=1e9, capacity=1e9)
TOKEN = b"sk-bench-0123456789abcdef"


async def tool(request: Request) -> Response:
    return PlainTextResponse("ok")


def bare() -> Starlette:
    return Starlette(routes=[Route("/tool", tool, methods=["POST"])])


def with_tokenfuse(store: Any, *, lease: bool = False, loops: bool = True) -> Starlette:
    fuse = inbound_fuse(store, bucket=BUCKET, velocity=CALL_VELOCITY)
    options: dict[str, Any] = {} if loops else {"failure_loops": None}
    middleware = [Middleware(TokenFuse, fuse=fuse, lease=lease, **options)]
    return Starlette(routes=[Route("/tool", tool, methods=["POST"])], middleware=middleware)


def leases_of(app: Any) -> Any:
    """The ``Leases`` of the TokenFuse in a built Starlette app's middleware stack."""
    layer = app.middleware_stack
    while layer is not None and not hasattr(layer, "guard"):
        layer = getattr(layer, "app", None)
    return layer.guard.leases if layer is not None else None


def with_slowapi(storage_uri: str, prefix: str) -> Starlette:
    from slowapi import Limiter
    from slowapi.middleware import SlowAPIASGIMiddleware

    def bearer(request: Request) -> str:
        return request.headers.get("authorization", "")

    limiter = Limiter(
        key_func=bearer,
        default_limits=[LIMIT],
        headers_enabled=True,
        storage_uri=storage_uri,
        key_prefix=prefix,
    )
    app = Starlette(
        routes=[Route("/tool", tool, methods=["POST"])],
        middleware=[Middleware(SlowAPIASGIMiddleware)],
    )
    app.state.limiter = limiter
    return app


async def one_request(app: App, answered: list[float] | None = None) -> None:
    """One POST through ``app``; with ``answered``, also the microseconds until the response's
    last body message was sent: what the caller waits for. An ASGI server finishes the
    response there (uvicorn starts the connection's next request at once); what the app and
    its middleware do after it (the failure-loop breaker's note) holds the server's task, not
    the caller."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/tool",
        "raw_path": b"/tool",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"bench"), (b"authorization", b"Bearer " + TOKEN)],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    status = 0
    started = time.perf_counter_ns()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif answered is not None and not message.get("more_body", False):
            answered.append((time.perf_counter_ns() - started) / 1000)

    await app(scope, receive, send)
    if status != 200:
        raise RuntimeError(f"benchmark request answered {status}")


async def bare_commands(store: RedisStore) -> list[Any]:
    """The floor of direct mode: the ``Admit`` and ``CheckLoops`` script calls of the
    benchmark's caller as redis-py sends them, with nothing of tokenfuse around them (no
    codec, no decision): encoded once, sent as they are (the scripts loaded first)."""
    key = inbound_fuse(store)._key(Identity.secret(TOKEN.decode()))
    admit = Admit(key, cost=1, amount=1, velocity=CALL_VELOCITY, bucket=BUCKET)
    check = CheckLoops(key, "0" * 16, FailureLoopPolicy().core)
    for op in (admit, check):
        await store.arun(op)
    keys = [store._known(op)[0] for op in (admit, check)]
    return store._commands([admit, check], keys, store._clients.async_heads())


REFERENCES = (
    "redis.asyncio PING",
    "RedisStore.arun(Admit)",
    "arun(Lease), 100 calls",
    "Admit call, bare",
    "Admit + CheckLoops calls, bare",
    "redis.asyncio PING, right after another call",
)
LEASED = "TokenFuse (Redis, lease)"
LEASED_ALONE = "TokenFuse (Redis, lease, failure_loops=None)"


Times = dict[str, list[float]]


async def measure(redis_url: str, requests: int) -> tuple[Times, Times]:
    """Each case's whole request and (for the apps) its time until the response was sent."""
    prefix = unique_prefix("mw")
    redis_store = RedisStore.from_url(redis_url, prefix=prefix)
    apps = {
        "bare Starlette endpoint": bare(),
        "TokenFuse (MemoryStore)": with_tokenfuse(MemoryStore()),
        "TokenFuse (RedisStore)": with_tokenfuse(redis_store),
        LEASED: with_tokenfuse(redis_store, lease=True),
        # the failure-loop breaker off: what its check (one more script) costs
        "TokenFuse (MemoryStore, failure_loops=None)": with_tokenfuse(MemoryStore(), loops=False),
        "TokenFuse (RedisStore, failure_loops=None)": with_tokenfuse(redis_store, loops=False),
        LEASED_ALONE: with_tokenfuse(redis_store, lease=True, loops=False),
        "slowapi (memory)": with_slowapi("memory://", prefix),
        "slowapi (redis)": with_slowapi(redis_url, prefix),
    }
    import redis.asyncio

    ping_client = redis.asyncio.Redis.from_url(redis_url)
    # The store key the middleware's fuse derives for the benchmark's caller.
    key = inbound_fuse(redis_store)._key(Identity.secret(TOKEN.decode()))
    admit = Admit(key, cost=1, amount=1, velocity=CALL_VELOCITY, bucket=BUCKET)
    bare_admit, bare_check = await bare_commands(redis_store)
    references: dict[str, Callable[[], Awaitable[object]]] = {
        REFERENCES[0]: ping_client.ping,
        REFERENCES[1]: lambda: redis_store.arun(admit),
        # A renewal that records the 100 calls its lease admitted and takes 100 more tokens.
        REFERENCES[2]: lambda: redis_store.arun(
            Lease(key, 1, 1, 100, 0, (1.0,) * 100, CALL_VELOCITY, BUCKET)
        ),
        # on the PING's client: the same options as the PING they are compared with
        REFERENCES[3]: lambda: ping_client.execute_command(*bare_admit),
        REFERENCES[4]: lambda: asend_all(ping_client, [bare_admit, bare_check]),
        # The first PING follows the apps' local work, as the middleware's own call does, and
        # pays the server's wake-up; this one follows a Redis call, and does not.
        REFERENCES[5]: ping_client.ping,
    }
    answered: Times = {name: [] for name in apps}
    cases = {
        name: (lambda app=app, times=answered[name]: one_request(app, times))
        for name, app in apps.items()
    }
    try:
        times = await interleave({**cases, **references}, requests)
        # the warm-up's requests were answered too: keep the timed ones
        return times, {name: values[-requests:] for name, values in answered.items()}
    finally:
        for name in (LEASED, LEASED_ALONE):
            leases = leases_of(apps[name])
            await leases.aclose()  # the unspent tokens go back, before the client closes
            print(f"{name}: {leases.counts}")
        view = redis_store.open_keys  # lease mode's loop checks: answered here, or sent
        if view is not None:
            counts = view.counts
            print(f"loop checks answered by the open-key view: {counts.loop_local}, "
                  f"sent to Redis: {counts.loop_round_trips}")  # fmt: skip
        print()
        await redis_store.aclose()
        await ping_client.aclose()
        delete_keys(redis_url, f"{prefix}:*")  # the loop strings too: <prefix>:loops:{...}
        delete_keys(redis_url, f"LIMITS:*{prefix}*")


def report(times: Times, answered: Times) -> None:
    base = percentile(times["bare Starlette endpoint"], 50)
    requests = len(times["bare Starlette endpoint"])
    print(f"{requests} requests per case, taking turns, microseconds per request\n")
    print(f"{'case':44s} {'p50':>8s} {'p99':>8s} {'added p50':>10s}")
    added: dict[str, float] = {}
    for name, values in times.items():
        p50 = percentile(values, 50)
        added[name] = p50 - base
        extra = "" if name.startswith("bare") or name in REFERENCES else f"{added[name]:10.1f}"
        if name in REFERENCES:
            name = f"(ref) {name}"
        print(f"{name:44s} {p50:8.1f} {percentile(values, 99):8.1f} {extra}")
    print()
    for store in ("memory", "redis"):
        ours = added["TokenFuse (MemoryStore)" if store == "memory" else "TokenFuse (RedisStore)"]
        theirs = added[f"slowapi ({store})"]
        print(f"{store:6s}: TokenFuse adds {ours:6.1f} us, slowapi {theirs:6.1f} us "
              f"(TokenFuse / slowapi = {ours / theirs:.2f})")  # fmt: skip
    redis_added = added["TokenFuse (RedisStore)"]
    ping = percentile(times[REFERENCES[0]], 50)
    ratio = redis_added / ping
    verdict = "met" if ratio <= 1.3 else "MISSED"
    print(f"target p50 added with RedisStore <= 1.3x an async PING: {verdict} ({ratio:.2f}x)")
    warm = percentile(times[REFERENCES[5]], 50)
    print(f"  the same against a PING right after another call ({warm:.1f} us, no wake-up): "
          f"{redis_added / warm:.2f}x")  # fmt: skip
    leased = added[LEASED]
    verdict = "met" if leased <= 100 else "MISSED"
    renewal = percentile(times[REFERENCES[2]], 50)
    admit = percentile(times[REFERENCES[1]], 50)
    print(f"store time per call: direct {admit:.1f} us, lease mode {renewal / 100:.1f} us "
          f"(a renewal of 100 calls: {renewal:.1f} us)")  # fmt: skip
    print(f"target p50 added with RedisStore in lease mode <= 0.1 ms: {verdict} "
          f"({leased / 1000:.3f} ms; {leased / redis_added:.2f}x the direct mode, "
          f"{leased / ping:.2f}x an async PING)")  # fmt: skip
    alone_floor = percentile(times[REFERENCES[3]], 50)
    both_floor = percentile(times[REFERENCES[4]], 50)
    print(f"direct mode's floor: the scripts alone, sent bare: Admit {alone_floor:.1f} us "
          f"({alone_floor / ping:.2f}x an async PING), Admit + CheckLoops in one round trip "
          f"{both_floor:.1f} us ({both_floor / ping:.2f}x)")  # fmt: skip
    direct, alone = added["TokenFuse (RedisStore, failure_loops=None)"], added[LEASED_ALONE]
    print(f"failure_loops=None: direct adds {direct:.1f} us ({direct / ping:.2f}x an async PING), "
          f"lease mode {alone:.1f} us ({alone / ping:.2f}x)")  # fmt: skip
    report_answered(answered, ping)


def report_answered(answered: Times, ping: float) -> None:
    """The caller's side: what each case adds until the response is sent. What the
    middleware does after it (the breaker's note of the call) is left out here."""
    base = percentile(answered["bare Starlette endpoint"], 50)
    print("\nuntil the response is sent (what the caller waits for), added p50 in us\n")
    print(f"{'case':44s} {'added p50':>10s} {'/ async PING':>13s}")
    for name, values in answered.items():
        if name.startswith("bare"):
            continue
        added = percentile(values, 50) - base
        print(f"{name:44s} {added:10.1f} {added / ping:12.2f}x")
    direct = percentile(answered["TokenFuse (RedisStore)"], 50) - base
    verdict = "met" if direct / ping <= 1.3 else "MISSED"
    print(f"target p50 added with RedisStore <= 1.3x an async PING, until the response is "
          f"sent: {verdict} ({direct / ping:.2f}x)")  # fmt: skip


#: The cases ``--just-requests`` runs (``benchmarks/instructions.sh middleware``).
JUST_CASES = ("bare", "memory", "memory-no-loops", "redis", "redis-no-loops")
#: The floor's cases for ``--just-requests`` (no app: the calls alone).
JUST_FLOOR = ("ping", "bare-admit", "bare-admit-check")


async def just_requests(case: str, requests: int, redis_url: str) -> None:
    """``requests`` requests of one case, untimed: what ``benchmarks/instructions.sh`` runs
    under callgrind to count the middleware's instructions per request."""
    import redis.asyncio

    store: Any = None
    prefix = unique_prefix("mw")
    ping_client = redis.asyncio.Redis.from_url(redis_url)
    if case.startswith("redis") or case in JUST_FLOOR:
        store = RedisStore.from_url(redis_url, prefix=prefix)
    elif case != "bare":
        store = MemoryStore()
    call: Callable[[], Awaitable[object]]
    if case == "ping":
        call = ping_client.ping
    elif case.startswith("bare-admit"):
        commands = await bare_commands(store)
        if case == "bare-admit":
            call = partial(ping_client.execute_command, *commands[0])
        else:
            call = partial(asend_all, ping_client, commands)
    else:
        loops = not case.endswith("no-loops")
        app = bare() if store is None else with_tokenfuse(store, loops=loops)
        call = partial(one_request, app)
    try:
        for _ in range(50):  # warm: caches filled, every lazy import done, the scripts loaded
            await call()
        view = getattr(store, "open_keys", None)
        if view is not None:  # its loop checks answered here in every run, FEW's as MANY's
            view.wait_synced(30)  # (under callgrind, the view's thread may lag the requests)
        for _ in range(requests):
            await call()
    finally:
        await ping_client.aclose()
        if isinstance(store, RedisStore):
            await store.aclose()
            delete_keys(redis_url, f"{prefix}:*")


def main() -> None:
    parser = options(__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per case and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--just-requests",
        nargs=2,
        metavar=("CASE", "REQUESTS"),
        help=f"{'|'.join(JUST_CASES + JUST_FLOOR)} N: N untimed requests (or calls) of one case",
    )
    args = parser.parse_args()
    if args.just_requests:
        case, requests = args.just_requests
        if case not in JUST_CASES + JUST_FLOOR:
            cases = ", ".join(JUST_CASES + JUST_FLOOR)
            parser.error(f"--just-requests: the case is one of {cases}")
        asyncio.run(just_requests(case, int(requests), args.redis))
        return
    report(*asyncio.run(measure(args.redis, args.requests * args.rounds)))


if __name__ == "__main__":
    main()
