"""``TokenFuse(..., lease=...)`` / ``TokenFuseWSGI``: calls admitted from leases, on every
framework; the same answers as the direct mode, with a round trip per lease."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import Clock
from tests.middleware.apps import Call
from tests.middleware.servers import free_port
from tokenfuse import FREE, Identity, MemoryStore
from tokenfuse._core.lease import LeasePolicy
from tokenfuse._errors import ConfigurationError
from tokenfuse._middleware import CALL_VELOCITY, TokenFuse, inbound_fuse

AUTH = {"Authorization": "Bearer sk-test-lease-0001"}


class CountingStore(MemoryStore):
    """A MemoryStore that counts the operations it runs, by name: the round trips."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.ran: Counter[str] = Counter()

    def run(self, op: Any) -> Any:
        self.ran[op.name] += 1
        return super().run(op)

    def run_many(self, ops: Any) -> Any:
        self.ran["+".join(op.name for op in ops)] += 1  # a pipeline: one round trip
        return super().run_many(ops)


def test_leased_calls_get_the_direct_modes_answers(
    serve: Callable[..., Call], clock: Clock
) -> None:
    store = CountingStore(clock=clock)
    fuse = inbound_fuse(store, bucket=FREE, velocity=CALL_VELOCITY)
    call = serve(fuse=fuse, lease=LeasePolicy(size=10, lifetime=60, top_up=False))

    replies = [call("POST", "/tools/refund", AUTH) for _ in range(51)]

    assert [reply.status for reply in replies] == [200] * 50 + [429]
    assert replies[-1].json()["type"] == "quota_exhausted"
    assert "retry-after" in replies[-1].headers
    assert all("ratelimit" in reply.headers for reply in replies)
    # Leases of 11, 11, 11, 11 and the 6 left; the sixth renewal refused: never an Admit.
    assert (store.ran["lease"], store.ran["admit"]) == (6, 0)
    # A MemoryStore runs each admitted call's failure-loop check (in process: no round trip);
    # a RedisStore answers it from its open-key view (below).
    assert store.ran["check_loops"] == 50
    # Every admitted call reached the velocity window, the local ones with the next renewal.
    assert fuse.status(Identity.secret(AUTH["Authorization"].split()[1])).rate == 50


@pytest.mark.redis
def test_lease_mode_checks_loops_without_a_round_trip_and_still_refuses_a_loop(
    serve: Callable[..., Call], redis_url: str, prefix: str
) -> None:
    from tokenfuse._stores.redis import RedisStore

    class CountingRedisStore(RedisStore):
        """Counts the operations sent to Redis, by name (the open-key view's answers are
        sent nowhere, so they are not counted)."""

        ran: Counter[str]

        def _result(self, op: Any, key: str, reply: Any) -> Any:
            self.ran[op.name] += 1
            return super()._result(op, key, reply)

    store = CountingRedisStore.from_url(redis_url, prefix=prefix)
    store.ran = Counter()
    fuse = inbound_fuse(store, bucket=FREE, velocity=CALL_VELOCITY)
    call = serve(fuse=fuse, closing=store, lease=LeasePolicy(size=10, lifetime=60, top_up=False))
    view = store.open_keys
    assert view is not None and view.wait_synced(5.0)

    healthy = [call("POST", "/tools/refund", AUTH) for _ in range(20)]

    assert [reply.status for reply in healthy] == [200] * 20
    assert store.ran["check_loops"] == 0  # every check answered by the view
    assert view.counts.loop_local == 20 and view.counts.loop_round_trips == 0
    assert store.ran["lease"] == 2  # the leases: the only round trips before the app

    # A call that keeps failing (an unknown route: 404) is still refused as a loop.
    looping = [call("POST", "/tools/missing", AUTH) for _ in range(4)]

    assert [reply.status for reply in looping] == [404, 404, 404, 429]
    assert looping[-1].json()["type"] == "failure_loop"
    assert store.ran["note_loop"] == 3 and store.ran["check_loops"] == 0
    assert call("POST", "/tools/refund", AUTH).status == 200  # other calls go on


@pytest.mark.redis
def test_the_direct_mode_sends_the_admission_alone_and_still_refuses_a_loop(
    serve: Callable[..., Call], redis_url: str, prefix: str
) -> None:
    """Repeats not refused: the check is the open-key view's too, so the round trip before the
    app is the admission's alone (``Admit``, no ``CheckLoops`` beside it)."""
    from tokenfuse._stores.redis import RedisStore

    class CountingRedisStore(RedisStore):
        """Counts the round trips by the operations sent in them (view answers: none)."""

        sent: Counter[str]

        def _args(self, op: Any) -> Any:
            self.sent[op.name] += 1
            return super()._args(op)

    store = CountingRedisStore.from_url(redis_url, prefix=prefix)
    store.sent = Counter()
    fuse = inbound_fuse(store, bucket=FREE, velocity=CALL_VELOCITY)
    call = serve(fuse=fuse, closing=store)
    view = store.open_keys
    assert view is not None and view.wait_synced(5.0)

    healthy = [call("POST", "/tools/refund", AUTH) for _ in range(20)]

    assert [reply.status for reply in healthy] == [200] * 20
    assert store.sent["admit"] == 20 and store.sent["check_loops"] == 0
    assert view.counts.loop_local == 20 and view.counts.loop_round_trips == 0

    looping = [call("POST", "/tools/missing", AUTH) for _ in range(4)]

    assert [reply.status for reply in looping] == [404, 404, 404, 429]
    assert looping[-1].json()["type"] == "failure_loop"
    assert store.sent["note_loop"] == 3 and store.sent["check_loops"] == 0
    assert call("POST", "/tools/refund", AUTH).status == 200


def test_on_repeat_refuse_keeps_the_loop_check_s_round_trip_in_lease_mode(
    serve: Callable[..., Call], clock: Clock
) -> None:
    """Repeats refused: every send must be counted by the store, so no local answer."""
    from tokenfuse._transport import FailureLoopPolicy

    store = CountingStore(clock=clock)
    fuse = inbound_fuse(store, bucket=FREE, velocity=CALL_VELOCITY)
    refuse = FailureLoopPolicy(on_repeat="refuse", repeats=3)
    call = serve(fuse=fuse, lease=True, failure_loops=refuse)
    guard_ops: list[Any] = []
    original = store.run

    def run(op: Any) -> Any:
        guard_ops.append(op)
        return original(op)

    store.run = run  # type: ignore[method-assign]

    replies = [call("POST", "/tools/refund", AUTH) for _ in range(3)]

    assert [reply.status for reply in replies] == [200, 200, 429]
    assert replies[-1].json()["type"] == "repeat_loop"
    checks = [op for op in guard_ops if op.name == "check_loops"]
    assert len(checks) == 3 and not any(op.local for op in checks)


class AsyncOnlyStore(MemoryStore):
    """A MemoryStore with no sync face, as a ``RedisStore`` over a ``redis.asyncio`` client."""

    has_sync = False


def test_lease_mode_asks_the_loop_check_on_an_async_only_store() -> None:
    """In lease mode the loop check is not sent with the admission: the ASGI shell asks it
    on its own, awaiting the store's async face (it has no other), and a loop is still
    refused."""
    from contextlib import ExitStack

    from tests.middleware.apps import starlette_client

    fuse = inbound_fuse(AsyncOnlyStore(), bucket=FREE, velocity=CALL_VELOCITY)
    assert fuse.has_async and not fuse.has_sync
    with ExitStack() as stack:
        call = starlette_client(stack, fuse=fuse, lease=LeasePolicy(size=10, lifetime=60))
        assert [call("POST", "/tools/refund", AUTH).status for _ in range(3)] == [200] * 3
        looping = [call("POST", "/tools/missing", AUTH) for _ in range(4)]
    assert [reply.status for reply in looping] == [404, 404, 404, 429]
    assert looping[-1].json()["type"] == "failure_loop"


def test_lease_is_off_by_default(serve: Callable[..., Call], clock: Clock) -> None:
    store = CountingStore(clock=clock)
    call = serve(fuse=inbound_fuse(store, bucket=FREE, velocity=CALL_VELOCITY))
    for _ in range(3):
        assert call("POST", "/tools/refund", AUTH).status == 200
    assert (store.ran["lease"], store.ran["admit"]) == (0, 3)
    # the direct mode: each admission with its failure-loop check, in one round trip
    assert store.ran["admit+check_loops"] == 3


def test_lease_takes_a_bool_or_a_policy() -> None:
    with pytest.raises(ConfigurationError, match="lease"):
        TokenFuse(lambda scope, receive, send: None, lease="yes")  # type: ignore[arg-type]


@pytest.mark.redis
def test_a_dead_redis_fails_open_in_lease_mode(serve: Callable[..., Call]) -> None:
    from tokenfuse._stores.redis import RedisStore

    store = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", prefix="tf-mw-lease-dead")
    fuse = inbound_fuse(store)
    call = serve(fuse=fuse, closing=store, lease=True)

    replies = [call("POST", "/tools/refund", AUTH) for _ in range(10)]

    assert [reply.status for reply in replies] == [200] * 10
    assert all("ratelimit" not in reply.headers for reply in replies)
    # each request's admission and its failure-loop check: every undecided step is counted
    assert fuse.health.counts.failed + fuse.health.counts.skipped == 20


@pytest.mark.redis
def test_a_dead_redis_counts_one_failure_per_request_in_direct_mode(
    serve: Callable[..., Call],
) -> None:
    """The direct mode sends the admission and the loop check in one pipeline: a dead store
    fails it once per request (the lease mode above: twice), and every request goes ahead."""
    from tokenfuse._stores.redis import RedisStore

    store = RedisStore.from_url(f"redis://127.0.0.1:{free_port()}/0", prefix="tf-mw-direct-dead")
    fuse = inbound_fuse(store)
    call = serve(fuse=fuse, closing=store)

    replies = [call("POST", "/tools/refund", AUTH) for _ in range(10)]

    assert [reply.status for reply in replies] == [200] * 10
    assert fuse.health.counts.failed + fuse.health.counts.skipped == 10


def test_top_ups_give_the_same_answers(serve: Callable[..., Call], clock: Clock) -> None:
    """With top-ups (asyncio apps top a half-spent lease up in the background): the same
    answers, and still a fraction of the direct mode's round trips."""
    store = CountingStore(clock=clock)
    fuse = inbound_fuse(store, bucket=FREE, velocity=CALL_VELOCITY)
    call = serve(fuse=fuse, lease=LeasePolicy(size=10, lifetime=60))

    replies = [call("POST", "/tools/refund", AUTH) for _ in range(51)]

    assert [reply.status for reply in replies] == [200] * 50 + [429]
    assert store.ran["admit"] == 0
    assert store.ran["lease"] <= 12
    assert fuse.status(Identity.secret(AUTH["Authorization"].split()[1])).rate == 50


async def test_leases_go_back_at_lifespan_shutdown_before_the_app_closes_its_store(
    clock: Clock,
) -> None:
    store = CountingStore(clock=clock)
    fuse = inbound_fuse(store, bucket=FREE, velocity=CALL_VELOCITY)
    seen_at_shutdown: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        while True:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                seen_at_shutdown.append(store.ran["return_lease"])  # the app would close it now
                await send({"type": "lifespan.shutdown.complete"})
                return
            await send({"type": "lifespan.startup.complete"})

    middleware = TokenFuse(app, fuse=fuse, lease=LeasePolicy(size=10))
    leases = middleware.guard.leases
    assert leases is not None
    await leases.aadmit(Identity.named("agent"))
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent: list[Any] = []

    async def receive() -> Any:
        return incoming.pop(0)

    async def send(message: Any) -> None:
        sent.append(message)

    await middleware({"type": "lifespan"}, receive, send)
    assert seen_at_shutdown == [1]  # given back before the app heard of the shutdown
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert fuse.status("agent").bucket_level == 49
