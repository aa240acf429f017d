"""Store backends under test: one table, each driven through its sync or its asyncio face.

Tests ``await backend.run(Record(...))`` whatever the backend; for an async face that awaits
the store's ``arun``, so the async path really runs (``run`` is never called).
Redis backends use a prefix of their own and delete only their own keys afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
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
from tokenfuse._stores.redis_codec import (
    BUCKET_BLOCK,
    VELOCITY_BLOCK,
    bucket_state,
    key_of,
    velocity_state,
)

R = TypeVar("R")

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("redis-sync", id="redis-sync", marks=pytest.mark.redis),
    pytest.param("redis-async", id="redis-async", marks=pytest.mark.redis),
    pytest.param("fakeredis", id="fakeredis"),
]
REDIS_BACKENDS = BACKENDS[1:]


def unique_prefix() -> str:
    return f"tf-st-{uuid.uuid4().hex[:12]}"


def delete_prefix(client: redis.Redis, prefix: str) -> None:
    """SCAN/DEL this prefix's keys only: other tests share the server."""
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)


def read_state(blob: bytes | None) -> tuple[VelocityState | None, BucketState | None]:
    """The core's state objects from an identity's string as stored (``redis_codec``'s
    layout): the velocity block, if any, then the bucket block, if any; the length says which."""
    if not blob:
        return None, None
    vstate = bstate = None
    if len(blob) != BUCKET_BLOCK.size:
        numbers = VELOCITY_BLOCK.unpack_from(blob)
        vstate = velocity_state(numbers[:-1], numbers[-1])
    if len(blob) != VELOCITY_BLOCK.size:
        numbers = BUCKET_BLOCK.unpack_from(blob, len(blob) - BUCKET_BLOCK.size)
        bstate = bucket_state(numbers[:-2], *numbers[-2:])
    return vstate, bstate


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


async def open_backend(kind: str, request: pytest.FixtureRequest, clock: Clock) -> Backend:
    prefix = unique_prefix()
    if kind == "memory":
        return Backend(kind, MemoryStore(clock=clock), False, clock)
    if kind == "fakeredis":
        server = fakeredis.FakeServer()

        def fake() -> RedisStore:
            return RedisStore(fakeredis.FakeRedis(server=server), prefix=prefix, clock=clock)

        raw = fakeredis.FakeRedis(server=server)
        return Backend(kind, fake(), False, clock, raw, prefix, fake)
    url = request.getfixturevalue("redis_url")
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
