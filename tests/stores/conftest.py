"""Store backends under test: one table, each driven through its sync or its asyncio face.

Tests ``await backend.run(Record(...))`` whatever the backend; for an async face that awaits
the store's ``arun``, so the async path really runs (``run`` is never called).
Redis backends use a prefix of their own and delete only their own keys afterwards; a test
that must do what no one may do to a shared server (stop it, flush its scripts) runs on a
redis-server of its own (``own_redis``). ``all_at_once`` runs a burst of threads.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import fakeredis
import pytest
import redis
import redis.asyncio

from tests.conftest import Clock
from tokenfuse import MemoryStore
from tokenfuse._core.bucket import BucketState
from tokenfuse._core.velocity import VelocityState
from tokenfuse._stores.ops import Op
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_codec import key_of, states_of

R = TypeVar("R")

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("redis-sync", id="redis-sync", marks=pytest.mark.redis),
    pytest.param("redis-async", id="redis-async", marks=pytest.mark.redis),
    pytest.param("fakeredis", id="fakeredis"),
]
REDIS_BACKENDS = BACKENDS[1:]


class OwnRedis:
    """A redis-server this test owns: started on ``port``, stopped by its PID."""

    def __init__(self, port: int, workdir: Path, *settings: str) -> None:
        self.port = port
        self.workdir = workdir
        self.settings = settings  # more redis-server arguments, e.g. "--maxmemory", "10mb"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.workdir)),
                *self.settings,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # waiting for a server to boot, not for timing
            try:
                with redis.Redis(port=self.port, socket_connect_timeout=0.2) as probe:
                    probe.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:  # a stopped (SIGSTOP) server cannot exit
                os.kill(self.process.pid, signal.SIGCONT)
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture
def own_redis(free_port: int, tmp_path: Path) -> Iterator[OwnRedis]:
    """A redis-server of this test's own on a free port, stopped (by PID) afterwards."""
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server on PATH to start a server of the test's own")
    server = OwnRedis(free_port, tmp_path)
    server.start()
    yield server
    server.stop()


def unique_prefix() -> str:
    return f"tf-st-{uuid.uuid4().hex[:12]}"


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    """SCAN/DEL this prefix's keys only: other tests share the server."""
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)


def read_state(blob: bytes | None) -> tuple[VelocityState | None, BucketState | None]:
    """The core's state objects from an identity's string as stored (``redis_codec``)."""
    return states_of(blob) if blob else (None, None)


def read_states(
    client: redis.Redis, prefix: str, keys: Sequence[str]
) -> list[tuple[VelocityState | None, BucketState | None]]:
    """Each key's string as the core's state objects, read straight from Redis."""
    blobs = client.mget([key_of(prefix, key) for key in keys])
    return [read_state(blob) for blob in blobs]


@dataclass
class Backend:
    """A store and, for Redis backends, a sync client on the same server to look at keys."""

    kind: str
    store: Any
    is_async: bool
    clock: Clock
    raw: redis.Redis | None = None
    prefix: str = ""
    make_twin: Callable[[], Any] | None = None
    closers: list[Callable[[], Awaitable[None] | None]] = field(default_factory=list)

    async def run(self, op: Op[R]) -> R:
        """Run ``op`` through the face under test: ``arun`` or ``run``."""
        if self.is_async:
            return await self.store.arun(op)  # type: ignore[no-any-return]
        return self.store.run(op)  # type: ignore[no-any-return]

    def twin(self) -> Backend:
        """Another store on the same server and prefix: another process, as far as it knows."""
        assert self.make_twin is not None
        return Backend(self.kind, self.make_twin(), self.is_async, self.clock, self.raw)

    def key(self, key: str) -> str:
        return key_of(self.prefix, key)


async def open_backend(
    kind: str, request: pytest.FixtureRequest, clock: Clock, url: str | None = None
) -> Backend:
    """A backend of ``kind``; Redis backends on ``url``, by default the shared test server."""
    prefix = unique_prefix()
    if kind == "memory":
        return Backend(kind, MemoryStore(clock=clock), False, clock)
    if kind == "fakeredis":
        server = fakeredis.FakeServer()

        def fake() -> RedisStore:
            return RedisStore(fakeredis.FakeRedis(server=server), prefix=prefix, clock=clock)

        raw = fakeredis.FakeRedis(server=server)
        return Backend(kind, fake(), False, clock, raw, prefix, fake)
    url = url or request.getfixturevalue("redis_url")
    raw = redis.Redis.from_url(url)
    backend = Backend(kind, None, kind == "redis-async", clock, raw, prefix)
    backend.closers.append(raw.close)  # closers run last first: the stores' clients first
    backend.closers.append(lambda: delete_prefix(raw, prefix))

    def real() -> RedisStore:
        if backend.is_async:
            client: Any = redis.asyncio.Redis.from_url(url)
            backend.closers.append(client.aclose)
        else:
            client = redis.Redis.from_url(url)
            backend.closers.append(client.close)
        return RedisStore(client, prefix=prefix, clock=clock)

    backend.store = real()
    backend.make_twin = real
    return backend


async def close_backend(backend: Backend) -> None:
    for close in reversed(backend.closers):
        result = close()
        if result is not None:
            await result


@pytest.fixture(params=BACKENDS)
async def backend(request: pytest.FixtureRequest, clock: Clock) -> AsyncIterator[Backend]:
    opened = await open_backend(request.param, request, clock)
    yield opened
    await close_backend(opened)


@pytest.fixture(params=REDIS_BACKENDS)
async def redis_backend(request: pytest.FixtureRequest, clock: Clock) -> AsyncIterator[Backend]:
    opened = await open_backend(request.param, request, clock)
    yield opened
    await close_backend(opened)


def all_at_once(call: Callable[[], R], times: int) -> list[R]:
    """``call`` from ``times`` threads released together; their results."""
    start = threading.Barrier(times)
    results: list[R] = []

    def one() -> None:
        start.wait(30)
        results.append(call())

    threads = [threading.Thread(target=one) for _ in range(times)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == times
    return results


class HeldAnnouncements:
    """A store whose view's subscriber thread has fallen behind: the announcements it hears
    are held here, in the order heard, until the test hands them on (``OpenKeys.apply``).
    ``other`` is another process on the same prefix and clock, without a view."""

    def __init__(self, store: RedisStore, other: RedisStore) -> None:
        assert store.open_keys is not None and store.open_keys.wait_synced(5.0)
        self.store, self.other, self.view = store, other, store.open_keys
        self.heard: list[str] = []
        self._changed = threading.Condition()
        self.view.apply = self._hold  # type: ignore[method-assign]  # the thread's call

    def _hold(self, text: str) -> None:
        with self._changed:
            self.heard.append(text)
            self._changed.notify_all()

    def wait_for(self, count: int, timeout: float = 5.0) -> list[str]:
        """The first ``count`` announcements, once heard (ends on the thread's own call)."""
        with self._changed:
            self._changed.wait_for(lambda: len(self.heard) >= count, timeout)
            assert len(self.heard) >= count, f"heard only {self.heard}"
            return self.heard[:count]


@pytest.fixture
def behind(redis_url: str, redis_prefix: str, clock: Clock) -> Iterator[HeldAnnouncements]:
    store = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock)
    other = RedisStore.from_url(redis_url, prefix=redis_prefix, clock=clock, open_keys=False)
    try:
        yield HeldAnnouncements(store, other)
    finally:
        store.close()
        other.close()
