"""The redis-py clients behind a ``RedisStore``: one given by the caller, or a sync and an asyncio
client built lazily from a URL, each with the operation scripts registered on it.

``register_script`` gives us EVALSHA with redis-py's own NOSCRIPT handling (a ``SCRIPT FLUSH``
or a restarted server costs one ``SCRIPT LOAD``, then EVALSHA again), on standalone, Sentinel
and Cluster clients alike.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

try:
    import redis
    import redis.asyncio
    import redis.asyncio.cluster
    import redis.asyncio.retry
    import redis.cluster
    from redis.backoff import NoBackoff
    from redis.commands.core import AsyncScript, Script
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("RedisStore needs redis-py: pip install 'tokenfuse[redis]'") from exc

from .._errors import ConfigurationError
from .redis_scripts import script_sources

__all__ = ["REDIS_ERRORS", "AsyncClient", "Clients", "SyncClient"]

SyncClient = redis.Redis | redis.cluster.RedisCluster
AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

#: What redis-py raises for infrastructure trouble (the cluster client also raises a
#: RedisClusterException that is no RedisError, e.g. when no node answers).
REDIS_ERRORS = (redis.RedisError, redis.exceptions.RedisClusterException, OSError)

#: A decision must not wait long on Redis: the Fuse fails open and backs off instead.
URL_DEFAULTS: dict[str, Any] = {
    "socket_timeout": 0.25,
    "socket_connect_timeout": 0.25,
    "health_check_interval": 30,
}

_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def _cluster_url(url: str) -> tuple[str, bool]:
    """``redis+cluster://h:p`` -> (``redis://h:p``, True); other URLs unchanged."""
    scheme, sep, rest = url.partition("://")
    plain = _CLUSTER_SCHEMES.get(scheme.lower())
    return (f"{plain}{sep}{rest}", True) if plain else (url, False)


class Clients:
    """Hands out the registered scripts of the sync or the asyncio client.

    A face the store was not given raises ``ConfigurationError`` at its first use.
    """

    def __init__(
        self,
        *,
        make_sync: Callable[[], SyncClient] | None,
        make_async: Callable[[], AsyncClient] | None,
        owned: bool,
        described: str,
    ) -> None:
        self._make_sync = make_sync
        self._make_async = make_async
        self._owned = owned  # close only the clients we built
        self.described = described
        self._sync: SyncClient | None = None
        self._async: AsyncClient | None = None
        self._sync_scripts: Mapping[str, Script] | None = None
        self._async_scripts: Mapping[str, AsyncScript] | None = None
        self._lock = threading.Lock()

    @property
    def has_sync(self) -> bool:
        return self._make_sync is not None

    @property
    def has_async(self) -> bool:
        return self._make_async is not None

    @classmethod
    def wrap(cls, client: SyncClient | AsyncClient) -> Clients:
        if isinstance(client, (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)):
            return cls(make_sync=None, make_async=lambda: client, owned=False, described="async")
        if isinstance(client, (redis.Redis, redis.cluster.RedisCluster)):
            return cls(make_sync=lambda: client, make_async=None, owned=False, described="sync")
        raise ConfigurationError(
            "RedisStore needs a redis.Redis, redis.cluster.RedisCluster or their "
            f"redis.asyncio counterparts, not {type(client).__name__}"
        )

    @classmethod
    def from_url(cls, url: str, *, cluster: bool, options: Mapping[str, Any]) -> Clients:
        url, cluster_scheme = _cluster_url(url)
        cluster = cluster or cluster_scheme
        sync_options = {**URL_DEFAULTS, **options}
        async_options = dict(sync_options)
        # One immediate retry survives a stale pooled connection (a restarted server) without
        # redis-py's default of ten retries with back-off on every call to a dead server.
        sync_options.setdefault("retry", Retry(NoBackoff(), 1))
        async_options.setdefault("retry", redis.asyncio.retry.Retry(NoBackoff(), 1))

        def make_sync() -> SyncClient:
            if cluster:
                return redis.cluster.RedisCluster.from_url(url, **sync_options)
            return redis.Redis.from_url(url, **sync_options)

        def make_async() -> AsyncClient:
            if cluster:
                return redis.asyncio.cluster.RedisCluster.from_url(url, **async_options)
            return redis.asyncio.Redis.from_url(url, **async_options)

        described = "cluster, sync+async" if cluster else "sync+async"
        return cls(make_sync=make_sync, make_async=make_async, owned=True, described=described)

    def sync_scripts(self) -> Mapping[str, Script]:
        scripts = self._sync_scripts
        if scripts is None:
            with self._lock:
                if self._sync_scripts is None:
                    if self._make_sync is None:
                        raise ConfigurationError(
                            "this RedisStore wraps an asyncio client: use arun (on a Fuse, the "
                            "a-prefixed methods), or RedisStore.from_url for both faces"
                        )
                    self._sync = client = self._make_sync()
                    self._sync_scripts = {
                        name: client.register_script(source)
                        for name, source in script_sources().items()
                    }
                scripts = self._sync_scripts
        return scripts

    def async_scripts(self) -> Mapping[str, AsyncScript]:
        scripts = self._async_scripts
        if scripts is None:
            if self._make_async is None:
                raise ConfigurationError(
                    "this RedisStore wraps a sync client: use run (on a Fuse, the plain "
                    "methods), or RedisStore.from_url for both faces"
                )
            # No lock: nothing awaits between the check and the assignment.
            self._async = client = self._make_async()
            scripts = self._async_scripts = {
                name: client.register_script(source) for name, source in script_sources().items()
            }
        return scripts

    def close(self) -> None:
        client, self._sync, self._sync_scripts = self._sync, None, None
        if client is not None and self._owned:
            client.close()

    async def aclose(self) -> None:
        self.close()
        client, self._async, self._async_scripts = self._async, None, None
        if client is not None and self._owned:
            await client.aclose()
