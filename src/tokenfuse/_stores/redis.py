"""``RedisStore``: the policy core run inside Redis as Lua, one round trip per decision.

Every operation is one EVALSHA of one script (``lua/<op>.lua`` after the shared ``_lib.lua``),
so each decision is atomic across every process that shares the server, and needs no lock,
pipeline or retry loop.

**Layout.** An identity ``<key>`` (what ``Fuse`` passes: ``name:hash``) is one string key,
``<prefix>:{<key>}`` (the hash tag picks its cluster slot), holding all of its state as
little-endian packed doubles::

    velocity block  VelocityState (86 doubles), then limit_override      696 bytes
    bucket block    BucketState (6 doubles), then capacity_override and  64 bytes
                    rate_override

Each block is there only when the identity has that state, in this order, so the string is
696, 64 or 760 bytes long and its length says which blocks it holds; an override of -1 means
none. The field order is in ``redis_codec`` (and ``lua/_lib.lua``); ``redis_codec.read_state``
turns a raw ``GET`` back into the core's state objects. A decision is ``TIME``, ``GET`` and
one ``SET ... PX ttl`` inside one script: each command a script calls costs a few
microseconds of fixed overhead on the server, more than the command itself, so everything an
identity has sits in one value written with its TTL in one call. Packed doubles are exact and
cost one C call each way in Lua, where separate text fields would cost a string and a
conversion apiece. The size is fixed whatever the traffic (under 1 KB of ``MEMORY USAGE``
per identity), and every operation that writes refreshes the TTL (``ttl``,
default 14 days). The overrides sit in the same value, so every process reads them with its
next decision, in the same round trip; set them with ``configure`` (a raw ``redis-cli HSET``
no longer can).

**Clock.** The server's ``TIME`` by default, one clock for every process; an explicit
``clock`` (tests, simulations) is passed to the scripts as an argument.

**Errors.** Every redis-py error becomes ``StoreUnavailable`` at one boundary
(``_Unavailable``); failing open and backing off is ``Fuse``'s job.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .._core.admission import AdmitVerdict
from .._core.bucket import BucketPolicy
from .._core.velocity import VelocityPolicy, VelocityVerdict
from .._errors import ConfigurationError, StoreUnavailable
from .base import UNSET, KeyStatus, Unset
from .redis_clients import REDIS_ERRORS, AsyncClient, Clients, SyncClient
from .redis_codec import (
    admit_args,
    admit_verdict,
    configure_args,
    key_of,
    key_status,
    record_args,
    velocity_verdict,
)

__all__ = ["RedisStore"]

_DEFAULT_TTL = 14 * 86_400.0

# (script name, KEYS, ARGV): one decision, packed the same way for the sync and async paths.
_Call = tuple[str, tuple[str, ...], tuple[str | bytes, ...]]


class _Unavailable:
    """The one boundary where redis-py errors become ``StoreUnavailable`` (sync and async)."""

    __slots__ = ("op",)

    def __init__(self, op: str) -> None:
        self.op = op

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, REDIS_ERRORS):
            raise StoreUnavailable(f"redis {self.op} failed: {exc}") from exc


class RedisStore:
    """State shared through Redis (standalone, Sentinel or Cluster), sync and asyncio.

    >>> store = RedisStore(redis.Redis())                        # doctest: +SKIP
    >>> store = RedisStore.from_url("redis://localhost:6379/0")  # doctest: +SKIP
    >>> fuse = Fuse(store)                                       # doctest: +SKIP

    Args:
        client: a ``redis.Redis`` or ``redis.cluster.RedisCluster`` (sync methods), or their
            ``redis.asyncio`` counterparts (a-prefixed methods). The caller keeps owning it.
        prefix: first part of every key; must not contain ``{`` or ``}``.
        clock: ``None`` for the server's clock; a callable returning epoch seconds otherwise.
        ttl: seconds an idle identity's state lives.
    """

    def __init__(
        self,
        client: SyncClient | AsyncClient,
        *,
        prefix: str = "tokenfuse",
        clock: Callable[[], float] | None = None,
        ttl: float = _DEFAULT_TTL,
    ) -> None:
        self._setup(Clients.wrap(client), prefix, clock, ttl)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "tokenfuse",
        clock: Callable[[], float] | None = None,
        ttl: float = _DEFAULT_TTL,
        cluster: bool = False,
        **options: Any,
    ) -> RedisStore:
        """A store with its own sync and asyncio clients, each built at its first use.

        ``redis+cluster://host:port`` (or ``cluster=True``) makes them cluster clients.
        ``options`` go to redis-py; the defaults are short: ``socket_timeout=0.25``,
        ``socket_connect_timeout=0.25``, ``health_check_interval=30`` and one immediate retry.

        >>> store = RedisStore.from_url("redis+cluster://10.0.0.5:7000")  # doctest: +SKIP
        """
        store = cls.__new__(cls)
        store._setup(Clients.from_url(url, cluster=cluster, options=options), prefix, clock, ttl)
        return store

    def _setup(
        self, clients: Clients, prefix: str, clock: Callable[[], float] | None, ttl: float
    ) -> None:
        if not prefix or "{" in prefix or "}" in prefix:
            # A brace in the prefix would become the hash tag: every key in one slot.
            raise ConfigurationError(f"prefix must be non-empty and brace-free, not {prefix!r}")
        if not (math.isfinite(ttl) and ttl > 0):
            raise ConfigurationError(f"ttl must be a positive number of seconds, not {ttl!r}")
        self._clients = clients
        self.prefix = prefix
        self.clock = clock
        self.ttl = float(ttl)
        self._ttl_ms = str(max(1, round(ttl * 1000)))

    def __repr__(self) -> str:
        return f"RedisStore(prefix={self.prefix!r}, {self._clients.described})"

    @property
    def has_sync(self) -> bool:
        """Whether the plain methods work (a sync client was given, or built from a URL)."""
        return self._clients.has_sync

    @property
    def has_async(self) -> bool:
        """Whether the a-prefixed methods work (an asyncio client, or built from a URL)."""
        return self._clients.has_async

    def close(self) -> None:
        """Close the sync client this store built (``from_url``); a given client stays open."""
        self._clients.close()

    async def aclose(self) -> None:
        """Close every client this store built (``from_url``)."""
        await self._clients.aclose()

    # -- one decision = one script call; packing and parsing shared by both faces ---------------

    def _now(self) -> str:
        return "" if self.clock is None else repr(float(self.clock()))

    def _run(self, op: str, keys: tuple[str, ...], args: tuple[str | bytes, ...]) -> Any:
        script = self._clients.sync_scripts()[op]
        with _Unavailable(op):
            return script(keys, args)

    async def _arun(self, op: str, keys: tuple[str, ...], args: tuple[str | bytes, ...]) -> Any:
        script = self._clients.async_scripts()[op]
        with _Unavailable(op):
            return await script(keys, args)

    def _gate(self, key: str) -> _Call:
        return "gate", (key_of(self.prefix, key),), (self._now(),)

    def _record(self, key: str, amount: float, velocity: VelocityPolicy) -> _Call:
        args = record_args(self._now(), self._ttl_ms, amount, velocity)
        return "record", (key_of(self.prefix, key),), args

    def _admit(
        self,
        key: str,
        cost: float,
        amount: float,
        velocity: VelocityPolicy | None,
        bucket: BucketPolicy | None,
    ) -> _Call:
        args = admit_args(self._now(), self._ttl_ms, cost, amount, velocity, bucket)
        return "admit", (key_of(self.prefix, key),), args

    def _status(self, key: str) -> _Call:
        return "status", (key_of(self.prefix, key),), (self._now(),)

    def _reset(self, key: str) -> _Call:
        return "reset", (key_of(self.prefix, key),), (self._ttl_ms,)

    def _configure(
        self,
        key: str,
        limit: float | None | Unset,
        capacity: float | None | Unset,
        rate: float | None | Unset,
    ) -> _Call:
        args = configure_args(self._now(), self._ttl_ms, limit, capacity, rate)
        return "configure", (key_of(self.prefix, key),), args

    # -- sync -------------------------------------------------------------------------------------

    def gate(self, key: str) -> VelocityVerdict:
        return velocity_verdict(self._run(*self._gate(key)))

    def record(self, key: str, amount: float, velocity: VelocityPolicy) -> VelocityVerdict:
        return velocity_verdict(self._run(*self._record(key, amount, velocity)))

    def admit(
        self,
        key: str,
        *,
        cost: float,
        amount: float,
        velocity: VelocityPolicy | None,
        bucket: BucketPolicy | None,
    ) -> AdmitVerdict:
        return admit_verdict(self._run(*self._admit(key, cost, amount, velocity, bucket)))

    def status(self, key: str, velocity: VelocityPolicy, bucket: BucketPolicy | None) -> KeyStatus:
        return key_status(self._run(*self._status(key)), velocity, bucket)

    def reset(self, key: str) -> None:
        self._run(*self._reset(key))

    def configure(
        self,
        key: str,
        *,
        limit: float | None | Unset = UNSET,
        capacity: float | None | Unset = UNSET,
        rate: float | None | Unset = UNSET,
    ) -> None:
        self._run(*self._configure(key, limit, capacity, rate))

    # -- async ------------------------------------------------------------------------------------

    async def agate(self, key: str) -> VelocityVerdict:
        return velocity_verdict(await self._arun(*self._gate(key)))

    async def arecord(self, key: str, amount: float, velocity: VelocityPolicy) -> VelocityVerdict:
        return velocity_verdict(await self._arun(*self._record(key, amount, velocity)))

    async def aadmit(
        self,
        key: str,
        *,
        cost: float,
        amount: float,
        velocity: VelocityPolicy | None,
        bucket: BucketPolicy | None,
    ) -> AdmitVerdict:
        return admit_verdict(await self._arun(*self._admit(key, cost, amount, velocity, bucket)))

    async def astatus(
        self, key: str, velocity: VelocityPolicy, bucket: BucketPolicy | None
    ) -> KeyStatus:
        return key_status(await self._arun(*self._status(key)), velocity, bucket)

    async def areset(self, key: str) -> None:
        await self._arun(*self._reset(key))

    async def aconfigure(
        self,
        key: str,
        *,
        limit: float | None | Unset = UNSET,
        capacity: float | None | Unset = UNSET,
        rate: float | None | Unset = UNSET,
    ) -> None:
        await self._arun(*self._configure(key, limit, capacity, rate))
