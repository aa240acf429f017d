"""Fixtures shared by every test area: a simulated clock and the real Redis servers."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlparse

import pytest

from tokenfuse.config import Settings, reload

REDIS_URL = os.environ.get("TOKENFUSE_REDIS_URL", "redis://127.0.0.1:6379/15")
CLUSTER_URL = os.environ.get("TOKENFUSE_CLUSTER_URL", "")


class Clock:
    """A clock the test moves by hand: no sleeping, no flakiness.

    Starts at a realistic epoch so that minute and slot arithmetic sees real-sized numbers.
    """

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def environment() -> Iterator[Callable[[dict[str, str]], Settings]]:
    """Make the process's settings those of a given ``TOKENFUSE_*`` environment (as if a new
    process started with it); the real environment's settings come back afterwards.

    ``TOKENFUSE_REDIS_URL`` names both the tests' Redis and the library's default store, so a
    test of the process-wide defaults asks for them with ``environment({})``: else running the
    suite against another Redis would change what it tests."""
    yield reload
    reload()


def _answers(url: str) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379), 0.5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The real Redis the tests use (database 15 by default, flushed per test by users)."""
    if not _answers(REDIS_URL):
        if os.environ.get("CI"):
            pytest.fail(f"no Redis answers at {REDIS_URL}; .ci/run should have started one")
        pytest.skip(f"no Redis answers at {REDIS_URL}")
    return REDIS_URL


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix of the test's own on the shared Redis; its keys are deleted afterwards."""
    redis = pytest.importorskip("redis")
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{name}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture(scope="session")
def cluster_url() -> str:
    """The 3-node Redis Cluster that .ci/run starts (TOKENFUSE_CLUSTER_URL)."""
    if not CLUSTER_URL or not _answers(CLUSTER_URL):
        if os.environ.get("CI"):
            pytest.fail("no Redis Cluster at TOKENFUSE_CLUSTER_URL; .ci/run should start one")
        pytest.skip("no Redis Cluster: run scripts/redis-cluster.sh, set TOKENFUSE_CLUSTER_URL")
    return CLUSTER_URL


@pytest.fixture
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
