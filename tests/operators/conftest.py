"""Fixtures of the operator tools: process settings that a test may change, and Redis prefixes."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest

from tokenfuse.config import Settings, reload


@pytest.fixture
def environment() -> Iterator[Callable[[dict[str, str]], Settings]]:
    """Make the process's settings those of a given ``TOKENFUSE_*`` environment (as if a new
    process started with it); the real environment's settings come back afterwards."""
    yield reload
    reload()


@pytest.fixture
def prefix(redis_url: str) -> Iterator[str]:
    """A Redis key prefix of this test's own; its keys are deleted afterwards (never FLUSHDB)."""
    redis = pytest.importorskip("redis")
    name = f"tf-ops-{uuid.uuid4().hex[:12]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{name}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
