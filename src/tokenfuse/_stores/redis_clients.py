"""The redis-py clients behind a ``RedisStore``: one given by the caller, or a sync and an asyncio
client built lazily from a URL, each with the operation scripts registered on it.

Each operation is an FCALL of its function in tokenfuse's Redis Functions library
(``redis_scripts.function_library``), on standalone, Sentinel and Cluster clients alike. A
server that answers that the function does not exist (its first use, a restart, a
``FUNCTION FLUSH``) gets the library (FUNCTION LOAD on that node: the key's, in a cluster)
and the call is made again; "library already exists" is another process's load, as good.
A server that cannot run functions (Redis < 7, FCALL or FUNCTION renamed or disabled, an ACL
user denied them, a library it refuses) moves that client to the scripts for good: EVALSHA,
and EVAL when the server answers NOSCRIPT (a ``SCRIPT FLUSH`` or a restarted server costs
one EVAL, which caches the script again). The decision that found out is made in the same
call; the move is logged once, with the reason, and shown as ``RedisStore.scripts``.

The timeouts and pools of the clients built from a URL, and the checks of a client the caller
gives, are in ``redis_budget``; the check of the server's memory policy is in
``redis_server``.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

try:
    import redis
    import redis.asyncio
    import redis.asyncio.cluster
    import redis.cluster
    from redis._parsers.commands import AsyncCommandsParser
    from redis.exceptions import NoPermissionError, NoScriptError, ResponseError
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("RedisStore needs redis-py: pip install 'tokenfuse[redis]'") from exc

from .._errors import ConfigurationError, StoreBusy, StoreUnavailable
from .redis_budget import (
    POOL_WAIT,
    AsyncBlockingPool,
    SyncBlockingPool,
    TurnTaking,
    client_advice,
    pool_exhausted,
    url_options,
)
from .redis_direct import async_sender, sync_sender
from .redis_scripts import SCRIPTS, function_library, script_sources
from .redis_server import acheck_server, check_server

__all__ = [
    "READER_TIMEOUT",
    "REDIS_ERRORS",
    "AsyncClient",
    "Clients",
    "Head",
    "ServerScripts",
    "SyncClient",
    "Unavailable",
    "retried_alone",
    "script_shas",
    "unavailable",
]

logger = logging.getLogger("tokenfuse")

SyncClient = redis.Redis | redis.cluster.RedisCluster
AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

#: What redis-py raises for infrastructure trouble (the cluster client also raises a
#: RedisClusterException that is no RedisError, e.g. when no node answers).
REDIS_ERRORS = (redis.RedisError, redis.exceptions.RedisClusterException, OSError)

#: A registered script: ``(keys, args) -> reply`` (a redis-py ``Script``, or a wrapper).
SyncCall = Callable[[Sequence[str], Sequence[str | bytes]], Any]
#: The same for an asyncio client (``AsyncScript``, or one taking turns).
AsyncCall = Callable[[Sequence[str], Sequence[str | bytes]], Awaitable[Any]]


def unavailable(op: str, exc: BaseException) -> StoreUnavailable:
    """The store error for a redis-py error: ``StoreBusy`` when only the pool was full."""
    if pool_exhausted(exc):
        return StoreBusy(f"redis {op} found no free connection: {exc}")
    return StoreUnavailable(f"redis {op} failed: {exc}")


class Unavailable:
    """Where redis-py errors become ``StoreUnavailable`` (sync and async):
    ``with Unavailable(op.name): ...``; the decisions' own path catches ``REDIS_ERRORS`` and
    calls ``unavailable`` itself, one object and two calls fewer per decision."""

    __slots__ = ("op",)

    def __init__(self, op: str) -> None:
        self.op = op

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, REDIS_ERRORS):
            raise unavailable(self.op, exc) from exc


#: How long a reader client (``sync_reader``) waits for an answer: a blocking read asks the
#: server to answer well within it.
READER_TIMEOUT = 5.0

_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def _cluster_url(url: str) -> tuple[str, bool]:
    """``redis+cluster://h:p`` -> (``redis://h:p``, True); other URLs unchanged."""
    scheme, sep, rest = url.partition("://")
    plain = _CLUSTER_SCHEMES.get(scheme.lower())
    return (f"{plain}{sep}{rest}", True) if plain else (url, False)


#: What one operation's call starts with: ``("FCALL", function)`` or ``("EVALSHA", sha)``.
Head = tuple[str, str]


def _function_missing(exc: BaseException) -> bool:
    return str(exc).startswith("Function not found")


def _functions_refused(exc: BaseException) -> bool:
    """The server cannot run an FCALL: Redis < 7, or FCALL renamed or disabled (an unknown
    command), or this user may not run it (NOPERM for the command; one for a key is the
    key's, not the functions')."""
    text = str(exc).lower()
    if isinstance(exc, NoPermissionError):
        return "'fcall" in text
    return "unknown command" in text


def retried_alone(reply: object) -> bool:
    """Whether a pipelined reply is an error that the operation's own call recovers from
    (NOSCRIPT; a function or the functions missing): the call was not run, run it alone."""
    if isinstance(reply, NoScriptError):
        return True
    return isinstance(reply, ResponseError) and (
        _function_missing(reply) or _functions_refused(reply)
    )


def _node_of(client: Any, key: str) -> dict[str, Any]:
    """Where FUNCTION LOAD goes: a cluster's key's node (only the node that lacks it: with
    one primary down the others still load), anywhere else the one server."""
    if isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)):
        return {"target_nodes": client.get_node_from_key(key)}
    return {}


class ServerScripts:
    """How one client's server runs the operations: as Redis Functions until it shows it
    cannot, then as EVALSHA scripts for good. Shared by that client's ``_Script``s."""

    def __init__(self, described: str) -> None:
        self.described = described  # the client's kind, for the log line
        self.reason = ""  # why not, once the server refused functions
        library = function_library()
        self.load = ("FUNCTION", "LOAD", library.code)
        self.evalsha_heads = {op: ("EVALSHA", sha) for op, sha in script_shas().items()}
        #: Each operation's head now: its FCALL's until the server refuses functions.
        self.heads: dict[str, Head] = {
            op: ("FCALL", name) for op, name in library.functions.items()
        }
        self._lock = threading.Lock()

    @property
    def functions(self) -> bool:
        """Whether the operations still run as functions."""
        return self.heads is not self.evalsha_heads

    def fall_back(self, exc: BaseException) -> None:
        """Every operation of this client EVALSHA from now on; said once."""
        with self._lock:
            if not self.functions:
                return
            self.heads, self.reason = self.evalsha_heads, f"{type(exc).__name__}: {exc}"
        logger.warning(
            "tokenfuse: this Redis runs no Redis Functions for the %s client (%s); its "
            "decisions are EVALSHA scripts instead, as before Redis 7 (slower by the cost "
            "of rebuilding the Lua library on every call)",
            self.described,
            self.reason,
        )

    def loaded(self, exc: BaseException | None) -> bool:
        """After FUNCTION LOAD answered ``exc`` (None: loaded): whether the library is there;
        a refusal other than another process's load moves the client to EVALSHA."""
        if exc is None or "already exists" in str(exc):
            return True
        self.fall_back(exc)
        return False


class _Script:
    """One operation on one client: FCALL of its function, or EVALSHA of its script when the
    server runs no functions (``ServerScripts``); each recovers as the module says.

    On a NOSCRIPT, redis-py's ``register_script`` would SCRIPT LOAD, which a cluster client
    sends to every primary: with one primary down, a script that a live node had not cached
    yet (its first use there, or after a restart) could never be loaded. EVAL runs on the
    key's own node and caches the script there; FUNCTION LOAD goes to the key's node alone.

    FCALL and EVALSHA go straight to a pooled connection on a plain client (``redis_direct``);
    the rare EVAL and FUNCTION LOAD through the client. Every reply is read undecoded
    (``NEVER_DECODE``): decisions reply with packed doubles.
    """

    __slots__ = ("client", "evalsha_head", "name", "send", "server", "source")

    send: Callable[[tuple[Any, ...]], Any]  # the call's words -> its reply (or awaitable)

    def __init__(self, client: Any, name: str, server: ServerScripts) -> None:
        self.client = client
        self.name = name
        self.server = server
        self.source = script_sources()[name]
        self.evalsha_head = server.evalsha_heads[name]

    def _next(self, exc: ResponseError, head: Head) -> str:
        """What to do after ``head``'s call failed with ``exc``: "eval", "load", "evalsha"
        (the server runs no functions: moved for good), or raise it."""
        if isinstance(exc, NoScriptError):
            return "eval"
        if head[0] == "FCALL":
            if _function_missing(exc):
                return "load"
            if _functions_refused(exc):
                self.server.fall_back(exc)
                return "evalsha"
        raise exc


@functools.cache
def script_shas() -> dict[str, str]:
    """The SHA1 of each operation's script (EVALSHA in a pipeline)."""
    return {
        name: hashlib.sha1(source.encode()).hexdigest() for name, source in script_sources().items()
    }


class SyncScript(_Script):
    def __init__(self, client: SyncClient, name: str, server: ServerScripts) -> None:
        super().__init__(client, name, server)
        self.send = sync_sender(client)

    def __call__(self, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
        head = self.server.heads[self.name]
        try:
            return self.send((*head, len(keys), *keys, *args))
        except ResponseError as exc:
            return self._recover(exc, head, keys, args)

    def _recover(
        self, exc: ResponseError, head: Head, keys: Sequence[str], args: Sequence[str | bytes]
    ) -> Any:
        step = self._next(exc, head)
        if step == "load" and self._load(keys[0]):
            try:
                return self.send((*head, len(keys), *keys, *args))
            except ResponseError as again:  # flushed again at once: this call EVALSHA
                if not _function_missing(again):
                    raise
        if step != "eval":
            try:
                return self.send((*self.evalsha_head, len(keys), *keys, *args))
            except NoScriptError:
                pass
        return self.client.execute_command(
            "EVAL", self.source, len(keys), *keys, *args, NEVER_DECODE=True
        )

    def _load(self, key: str) -> bool:
        try:
            self.client.execute_command(*self.server.load, **_node_of(self.client, key))
        except ResponseError as exc:
            return self.server.loaded(exc)
        return self.server.loaded(None)


class AsyncScript(_Script):
    def __init__(self, client: AsyncClient, name: str, server: ServerScripts) -> None:
        super().__init__(client, name, server)
        self.send = async_sender(client)

    async def __call__(self, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
        head = self.server.heads[self.name]
        try:
            return await self.send((*head, len(keys), *keys, *args))
        except ResponseError as exc:
            return await self._recover(exc, head, keys, args)

    async def _recover(
        self, exc: ResponseError, head: Head, keys: Sequence[str], args: Sequence[str | bytes]
    ) -> Any:
        step = self._next(exc, head)
        if step == "load" and await self._load(keys[0]):
            try:
                return await self.send((*head, len(keys), *keys, *args))
            except ResponseError as again:
                if not _function_missing(again):
                    raise
        if step != "eval":
            try:
                return await self.send((*self.evalsha_head, len(keys), *keys, *args))
            except NoScriptError:
                pass
        return await self.client.execute_command(
            "EVAL", self.source, len(keys), *keys, *args, NEVER_DECODE=True
        )

    async def _load(self, key: str) -> bool:
        try:
            await self.client.execute_command(*self.server.load, **_node_of(self.client, key))
        except ResponseError as exc:
            return self.server.loaded(exc)
        return self.server.loaded(None)


_FCALLS = ("FCALL", "FCALL_RO")


def _fcall_keys(words: Sequence[Any]) -> list[Any]:
    """The keys of ``FCALL <function> <numkeys> <key>...``: where EVALSHA's are."""
    return list(words[3 : 3 + int(words[2])])


def learn_fcall_keys(client: SyncClient | AsyncClient) -> None:
    """Teach a cluster client where an FCALL's keys are, as redis-py knows EVALSHA's: it
    otherwise asks a node (COMMAND GETKEYS, twice per call) before routing each FCALL."""
    if not isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)):
        return  # a plain client sends every command to its one server
    parser: Any = client.commands_parser
    if getattr(parser, "knows_fcall_keys", False):
        return
    get_keys = parser.get_keys
    if isinstance(client, redis.asyncio.cluster.RedisCluster):

        async def aget_keys(*words: Any) -> Any:
            if str(words[0]).upper() in _FCALLS:
                return _fcall_keys(words)
            return await get_keys(*words)

        parser.get_keys = aget_keys
    else:

        def sync_get_keys(connection: Any, *words: Any) -> Any:
            if str(words[0]).upper() in _FCALLS:
                return _fcall_keys(words)
            return get_keys(connection, *words)

        parser.get_keys = sync_get_keys
    parser.knows_fcall_keys = True


class _CommandTableOnce(AsyncCommandsParser):
    """redis-py's asyncio cluster client reloads the server's whole command table (COMMAND:
    100-300 ms of parsing on the event loop) each time it rebuilds its slot map, and it
    rebuilds it after every failure on a dead node: with one primary down, a third of the
    decisions would each stall every other one. The table does not change when a node dies:
    load it once. (The sync client keeps its table already.)"""

    __slots__ = ()

    async def initialize(self, node: Any = None) -> None:
        if not self.commands:
            await super().initialize(node)


def _keep_open() -> None:
    pass


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
        make_readers: tuple[Callable[[], SyncClient], Callable[[], AsyncClient]] | None = None,
    ) -> None:
        self._make_sync = make_sync
        self._make_async = make_async
        self._make_readers = make_readers
        self._readers: tuple[SyncClient | None, AsyncClient | None] = (None, None)
        self._owned = owned  # close only the clients we built
        self.described = described
        self._sync: SyncClient | None = None
        self._async: AsyncClient | None = None
        self._sync_scripts: Mapping[str, SyncCall] | None = None
        self._async_scripts: Mapping[str, AsyncCall] | None = None
        self._sync_server: ServerScripts | None = None
        self._async_server: ServerScripts | None = None
        self._server_checked = False
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
        sync_options = {**url_options(asyncio_client=False), **options}
        async_options = {**url_options(asyncio_client=True), **options}

        def make_sync(**changes: Any) -> SyncClient:
            if cluster:
                pool_class = functools.partial(SyncBlockingPool, timeout=POOL_WAIT)
                return redis.cluster.RedisCluster.from_url(
                    url, connection_pool_class=pool_class, **{**sync_options, **changes}
                )
            settings = {**sync_options, **changes}
            pool = SyncBlockingPool.from_url(url, timeout=POOL_WAIT, **settings)
            return redis.Redis.from_pool(pool)

        def make_async(**changes: Any) -> AsyncClient:
            settings = {**async_options, **changes}
            if cluster:
                client = redis.asyncio.cluster.RedisCluster.from_url(url, **settings)
                client.commands_parser = _CommandTableOnce()
                return client
            pool = AsyncBlockingPool.from_url(url, timeout=POOL_WAIT, **settings)
            return redis.asyncio.Redis.from_pool(pool)

        # Blocking reads (XREAD BLOCK of the event log) wait longer than a decision may.
        readers = (
            functools.partial(make_sync, socket_timeout=READER_TIMEOUT),
            functools.partial(make_async, socket_timeout=READER_TIMEOUT),
        )
        described = "cluster, sync+async" if cluster else "sync+async"
        return cls(
            make_sync=make_sync,
            make_async=make_async,
            owned=True,
            described=described,
            make_readers=readers,
        )

    def subscriber_client(self) -> tuple[SyncClient, Callable[[], None]]:
        """A client for a long-lived subscription (``open_keys``), and what lets it go when the
        subscription ends: on a pool of its own, never the decisions' pool, which may be small,
        and closed with its sockets. A cluster client subscribes on a connection of one node's
        pool; that client is the store's, left open."""
        client = self.sync_client()
        if isinstance(client, redis.cluster.RedisCluster):
            return client, _keep_open
        pool = client.connection_pool
        own = redis.ConnectionPool(connection_class=pool.connection_class, **pool.connection_kwargs)
        return redis.Redis(connection_pool=own), own.disconnect

    def sync_scripts(self) -> Mapping[str, SyncCall]:
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
                    self._check(client)
                    learn_fcall_keys(client)
                    server = self._sync_server = ServerScripts(f"{self.described} sync")
                    registered = {name: SyncScript(client, name, server) for name in SCRIPTS}
                    self._sync_scripts = self._sync_first_use(client, registered)
                scripts = self._sync_scripts
        return scripts

    def async_scripts(self) -> Mapping[str, AsyncCall]:
        scripts = self._async_scripts
        if scripts is None:
            if self._make_async is None:
                raise ConfigurationError(
                    "this RedisStore wraps a sync client: use run (on a Fuse, the plain "
                    "methods), or RedisStore.from_url for both faces"
                )
            # No lock: nothing awaits between the check and the assignment.
            self._async = client = self._make_async()
            self._check(client)
            learn_fcall_keys(client)
            server = self._async_server = ServerScripts(f"{self.described} asyncio")
            registered: Mapping[str, AsyncCall] = {
                name: AsyncScript(client, name, server) for name in SCRIPTS
            }
            if isinstance(client, redis.asyncio.cluster.RedisCluster):
                in_turn = TurnTaking.for_client(client)
                registered = {name: in_turn(script) for name, script in registered.items()}
            scripts = self._async_scripts = self._async_first_use(client, registered)
        return scripts

    def sync_heads(self) -> dict[str, Head]:
        """What each operation's call starts with on the sync client (FCALL or EVALSHA)."""
        self.sync_scripts()
        assert self._sync_server is not None
        return self._sync_server.heads

    def async_heads(self) -> dict[str, Head]:
        """``sync_heads`` for the asyncio client."""
        self.async_scripts()
        assert self._async_server is not None
        return self._async_server.heads

    @property
    def scripts(self) -> str:
        """How the decisions run: "functions" until a server of this store's clients refused
        them, then "evalsha" (the reason is in ``scripts_reason``)."""
        return "evalsha" if self.scripts_reason else "functions"

    @property
    def scripts_reason(self) -> str:
        """Why a client runs EVALSHA scripts ("" while every client runs functions)."""
        servers = (self._sync_server, self._async_server)
        return "; ".join(server.reason for server in servers if server and server.reason)

    def sync_client(self) -> SyncClient:
        """The sync client itself, for commands other than the scripts (``ListKeys``, the
        event log)."""
        self.sync_scripts()
        assert self._sync is not None
        return self._sync

    def async_client(self) -> AsyncClient:
        """The asyncio client itself, for commands other than the scripts (``ListKeys``)."""
        self.async_scripts()
        assert self._async is not None
        return self._async

    def sync_reader(self) -> SyncClient:
        """A client for blocking reads: one of its own with a ``READER_TIMEOUT`` when the
        store built its clients, else the sync client."""
        if self._make_readers is None:
            return self.sync_client()
        with self._lock:
            reader, areader = self._readers
            if reader is None:
                reader = self._make_readers[0]()
                self._readers = (reader, areader)
        return reader

    def async_reader(self) -> AsyncClient:
        """``sync_reader`` for asyncio code."""
        if self._make_readers is None:
            return self.async_client()
        areader = self._readers[1]
        if areader is None:  # no lock: nothing awaits between the check and the assignment
            areader = self._make_readers[1]()
            self._readers = (self._readers[0], areader)
        return areader

    # The server's memory policy is read after the first decision that succeeds (a dead
    # server at start-up must not cost a decision twice), once per store; then the plain
    # scripts replace these wrappers.

    def _first_success(self) -> bool:
        with self._lock:
            first, self._server_checked = not self._server_checked, True
        return first

    def _sync_first_use(
        self, client: SyncClient, scripts: Mapping[str, SyncCall]
    ) -> Mapping[str, SyncCall]:
        wrappers: dict[str, SyncCall] = {}

        def run(name: str, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
            result = scripts[name](keys, args)
            if self._sync_scripts is wrappers:
                self._sync_scripts = scripts
            if self._first_success():
                check_server(client)
            return result

        wrappers.update({name: functools.partial(run, name) for name in scripts})
        return wrappers

    def _async_first_use(
        self, client: AsyncClient, scripts: Mapping[str, AsyncCall]
    ) -> Mapping[str, AsyncCall]:
        wrappers: dict[str, AsyncCall] = {}

        async def run(name: str, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
            result = await scripts[name](keys, args)
            if self._async_scripts is wrappers:
                self._async_scripts = scripts
            if self._first_success():
                await acheck_server(client)
            return result

        wrappers.update({name: functools.partial(run, name) for name in scripts})
        return wrappers

    def _check(self, client: SyncClient | AsyncClient) -> None:
        """Say once, at first use, what in a caller's client breaks the decision budget."""
        if self._owned:
            return
        advice = client_advice(client)
        if advice:
            logger.warning(
                "tokenfuse: this RedisStore's %s client can hold decisions up or fail them "
                "open under a burst; change: %s (or use RedisStore.from_url)",
                type(client).__name__,
                "; ".join(advice),
            )

    def close(self) -> None:
        client, self._sync, self._sync_scripts = self._sync, None, None
        reader, self._readers = self._readers[0], (None, self._readers[1])
        for built in (client, reader):
            if built is not None and self._owned:
                built.close()

    async def aclose(self) -> None:
        self.close()
        client, self._async, self._async_scripts = self._async, None, None
        reader, self._readers = self._readers[1], (self._readers[0], None)
        for built in (client, reader):
            if built is not None and self._owned:
                await built.aclose()
