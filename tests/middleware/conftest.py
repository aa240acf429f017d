from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from functools import partial
from typing import Any

import pytest

from tests.conftest import Clock
from tests.middleware.apps import FRAMEWORKS, Call
from tokenfuse import FREE, BucketPolicy, Fuse, MemoryStore, VelocityPolicy
from tokenfuse._middleware import CALL_VELOCITY, inbound_fuse


@pytest.fixture(params=sorted(FRAMEWORKS))
def serve(request: pytest.FixtureRequest) -> Iterator[Callable[..., Call]]:
    """Build the tool API on each framework with the given middleware options."""
    with ExitStack() as stack:
        yield partial(FRAMEWORKS[request.param], stack)


@pytest.fixture
def store(clock: Clock) -> MemoryStore:
    return MemoryStore(clock=clock)


@pytest.fixture
def make_fuse(store: MemoryStore) -> Callable[..., Fuse]:
    def make(
        bucket: BucketPolicy | None = FREE,
        velocity: VelocityPolicy | None = CALL_VELOCITY,
        **options: Any,
    ) -> Fuse:
        return inbound_fuse(store, bucket=bucket, velocity=velocity, **options)

    return make


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A Redis key prefix of this test's own; its keys are deleted afterwards (never FLUSHDB)."""
    redis = pytest.importorskip("redis")
    name = f"tf-mw-{uuid.uuid4().hex[:12]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{name}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
