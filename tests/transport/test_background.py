"""``record="background"``: responses handed over at once, usage recorded in batches by a
worker, and nothing lost or blocked when the worker cannot keep up or is gone."""

from __future__ import annotations

import logging
import threading
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import Clock
from tokenfuse import CeilingExceeded, Fuse, MemoryStore, VelocityPolicy
from tokenfuse._stores.redis import RedisStore
from tokenfuse._transport import AsyncFuseTransport, FuseTransport
from tokenfuse._transport.recorder import Recorder

from .bodies import CASES
from .conftest import ChunkServer

CASE = CASES["anthropic-messages"]  # 200 tokens a call
CEILING = VelocityPolicy(limit=1_000, cold_start_limit=None)  # the sixth call trips


def background(lib: ModuleType, fuse: Fuse) -> tuple[ChunkServer, FuseTransport, Recorder]:
    """A server, a transport recording in the background for "agent", and its recorder."""
    server = ChunkServer(lib, CASE)
    transport = FuseTransport(server.transport(), fuse=fuse, key="agent", record="background")
    assert transport._recorder is not None
    return server, transport, transport._recorder


class HeldFuse(Fuse):
    """A fuse whose batches wait until the test lets them go: the worker is provably off the
    caller's path while one is held."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.go = threading.Event()

    def record_batch_with(self, items: Any, ops: Any) -> Any:
        assert self.go.wait(10)
        return super().record_batch_with(items, ops)


def test_the_response_does_not_wait_for_the_record(lib: ModuleType, clock: Clock) -> None:
    fuse = HeldFuse(MemoryStore(clock=clock), velocity=CEILING)
    server = ChunkServer(lib, CASE)
    transport = FuseTransport(server.transport(), fuse=fuse, key="agent", record="background")
    with lib.Client(transport=transport) as client:
        report = client.post(CASE.url).extensions["tokenfuse"]
        assert report.usage.total == 200 and report.record is None  # handed over, not recorded
        assert fuse.status("agent").rate == 0
        fuse.go.set()
        assert transport._recorder is not None and transport._recorder.flush()
        assert report.record is not None and report.record.rate == 200
    assert fuse.status("agent").rate == 200


def test_close_records_what_is_pending(lib: ModuleType, clock: Clock) -> None:
    fuse = Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(cold_start_limit=None))
    server = ChunkServer(lib, CASE)
    transport = FuseTransport(server.transport(), fuse=fuse, key="agent", record="background")
    with lib.Client(transport=transport) as client:
        for _ in range(50):
            client.post(CASE.url)
    assert fuse.status("agent").rate == 50 * 200
    recorder = transport._recorder
    assert recorder is not None and recorder.counts.recorded == 50
    assert recorder.counts.batches <= 50 and recorder.counts.inline == 0


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_a_batched_trip_refuses_the_next_call_at_once(
    lib: ModuleType, kind: str, clock: Clock, request: pytest.FixtureRequest
) -> None:
    """No wait for any announcement: on Redis the batch's trip marked the key in this
    process's open-key view; MemoryStore is the state itself."""
    if kind == "redis":
        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
        store: Any = RedisStore.from_url(url, prefix=prefix)
    else:
        store = MemoryStore(clock=clock)
    server, transport, recorder = background(lib, Fuse(store, velocity=CEILING))
    with lib.Client(transport=transport) as client:
        for _ in range(6):
            client.post(CASE.url)
        assert recorder.flush()
        with pytest.raises(CeilingExceeded):
            client.post(CASE.url)
    assert len(server.requests) == 6
    if kind == "redis":
        store.close()


def test_a_full_queue_records_on_the_callers_path(
    lib: ModuleType, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    fuse = HeldFuse(MemoryStore(clock=clock), velocity=VelocityPolicy(cold_start_limit=None))
    _, transport, recorder = background(lib, fuse)
    recorder.max_pending = 2
    with lib.Client(transport=transport) as client, caplog.at_level(logging.WARNING):
        # The worker takes what is pending (held there), two more wait, the rest cannot: they
        # are recorded at once, on the caller's path, and nothing waits on the held batch.
        reports = [client.post(CASE.url).extensions["tokenfuse"] for _ in range(6)]
        inline = [report for report in reports if report.record is not None]
        assert len(inline) == recorder.counts.inline >= 2
        assert "recording on the caller's path" in caplog.text
        fuse.go.set()
    assert fuse.status("agent").rate == 6 * 200  # none lost


def test_a_worker_that_cannot_start_never_breaks_a_call(
    lib: ModuleType, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    fuse = Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(cold_start_limit=None))
    server = ChunkServer(lib, CASE)
    transport = FuseTransport(server.transport(), fuse=fuse, key="agent", record="background")

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with lib.Client(transport=transport) as client:
        report = client.post(CASE.url).extensions["tokenfuse"]
    assert report.record is not None  # recorded inline
    assert transport._recorder is not None and transport._recorder.counts.inline == 1
    assert fuse.status("agent").rate == 200


async def test_the_async_transport_records_in_the_background(lib: ModuleType, clock: Clock) -> None:
    fuse = Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(cold_start_limit=None))
    server = ChunkServer(lib, CASE)
    transport = AsyncFuseTransport(server.transport(), fuse=fuse, key="agent", record="background")
    async with lib.AsyncClient(transport=transport) as client:
        for _ in range(3):
            await client.post(CASE.url)
    assert fuse.status("agent").rate == 600


def test_an_async_only_store_is_refused_for_background_records() -> None:
    import redis.asyncio

    from tokenfuse import ConfigurationError

    store = RedisStore(redis.asyncio.Redis())
    with pytest.raises(ConfigurationError, match="sync face"):
        Recorder(Fuse(store))
