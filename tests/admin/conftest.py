"""Fixtures of the admin tests: fuses on the real Redis (a prefix of the test's own) and on
memory with a simulated clock, and an HTTP client for the admin app."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import redis

from tests.conftest import Clock
from tests.middleware.servers import free_port, running
from tests.stores.conftest import delete_prefix
from tokenfuse import BucketPolicy, Fuse, MemoryStore, VelocityPolicy
from tokenfuse._stores.redis import RedisStore

TOKEN = "test-admin-token-0123456789"
#: Trips above 1,000 per minute; no cold-start ceiling to get in the way.
POLICY = VelocityPolicy(limit=1_000, cold_start_limit=None, cooldown=60)
BUCKET = BucketPolicy(rate=10, capacity=50)
#: The deployment secret every process of these tests shares (``TOKENFUSE_SECRET``): the key
#: ids a test derives (``Identity.key_id``) are then the ones its fuses show.
SECRET = "admin-tests-deployment-secret-0123456789"


@pytest.fixture(autouse=True)
def deployment_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENFUSE_SECRET", SECRET)


@pytest.fixture
def memory_fuse(clock: Clock) -> Fuse:
    return Fuse(MemoryStore(clock=clock), velocity=POLICY, bucket=BUCKET)


@pytest.fixture
async def redis_fuse(redis_url: str, redis_prefix: str) -> AsyncIterator[Fuse]:
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    yield Fuse(store, velocity=POLICY, bucket=BUCKET)
    await store.aclose()  # both clients, once the log's writes are done


@pytest.fixture
async def other_process(redis_url: str, redis_prefix: str) -> AsyncIterator[Fuse]:
    """Another fuse on the same Redis and prefix: another process, as far as it can tell."""
    store = RedisStore.from_url(redis_url, prefix=redis_prefix)
    yield Fuse(store, velocity=POLICY, bucket=BUCKET)
    await store.aclose()


async def settled(fuse: Fuse) -> Fuse:
    """``fuse`` once the events it logged from asyncio code are written."""
    await fuse.store.events.aflush()  # type: ignore[attr-defined]
    return fuse


def asgi_client(app: object, **options: object) -> httpx.AsyncClient:
    """An HTTP client of ``app`` as a loopback caller reaching a loopback server."""
    client = options.pop("client", ("127.0.0.1", 50_000))
    base_url = str(options.pop("base_url", "http://127.0.0.1:8787"))
    transport = httpx.ASGITransport(app=app, client=client)  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url=base_url, **options)  # type: ignore[arg-type]


@pytest.fixture
async def api(redis_fuse: Fuse) -> AsyncIterator[httpx.AsyncClient]:
    """The admin app of ``redis_fuse``, with the token on every request."""
    import tokenfuse.admin

    app = tokenfuse.admin.app(redis_fuse, token=TOKEN)
    async with asgi_client(app, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        yield client


SERVER_TOKEN = "server-admin-token-0123456789"


@pytest.fixture
def admin_server(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The URL of a uvicorn process serving ``tests.admin.admin_server``'s app on a prefix of
    its own; this process's environment names the same Redis and prefix, so
    ``admin_server.fuse()`` here decides on the keys the server shows."""
    prefix = f"tf-web-{uuid.uuid4().hex[:8]}"
    env = {"ADMIN_REDIS_URL": redis_url, "ADMIN_PREFIX": prefix, "ADMIN_TOKEN": SERVER_TOKEN}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    port = free_port()
    args = ["-m", "uvicorn", "tests.admin.admin_server:app", "--port", str(port)]
    try:
        with running([*args, "--log-level", "warning"], port, env=env):
            yield f"http://127.0.0.1:{port}"
    finally:
        with redis.Redis.from_url(redis_url) as raw:
            delete_prefix(raw, prefix)
