"""``RedisStore``: the policy core run inside Redis as Lua, one round trip per decision.

Every operation (``ops``) is one FCALL of its function in tokenfuse's Redis Functions library
(``lua/<op.name>.lua`` after the shared ``_lib.lua``; EVALSHA of it as a script where the
server runs no functions: ``redis_clients``), so each decision is atomic across every process
that shares the server, and needs no lock, pipeline or retry loop. ``redis_codec`` says how
each operation becomes the script's arguments and how its reply becomes the result; ``run``
and ``arun`` differ only in awaiting the script call.

``ListKeys``, the one operation about many keys, is no script: it walks the keyspace with
``SCAN`` (``redis_listing``).

**State.** All of an identity's state, live overrides included, is one packed string with a
TTL, ``<prefix>:{<key>}``, read and written once per decision: every process sees an override
with its next decision, in the same round trip. The layout is in ``redis_codec``, the reasons
for it in docs/design.md#state-layout. Every operation that writes refreshes the TTL (``ttl``,
default 14 days).

**Clock.** The server's ``TIME`` by default, one clock for every process; an explicit
``clock`` (tests, simulations) is passed to the scripts as an argument.

**Gates without a round trip.** By default the store keeps a local view of the open keys
(``open_keys``: a subscriber thread, started at the first gate, that every trip and reset
anywhere reaches at once) and answers gates from it once it is synced; until then, and
whenever the subscription is down, a gate is one round trip as before. A loop check that only
asks "is this call tripped?" (``CheckLoops.local``) is answered from the same view's tripped
calls. ``open_keys=False`` turns it off. A store over an asyncio client alone has no view
(it needs a sync client).

**Errors.** Every redis-py error becomes ``StoreUnavailable`` through one conversion
(``redis_clients.unavailable``, or the ``Unavailable`` block around it); failing open and
backing off is ``Fuse``'s job.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

from .._errors import ConfigurationError
from . import redis_listing
from .open_keys import OpenKeys
from .ops import CheckLoops, Gate, ListKeys, Op
from .redis_batch import Command, asend_all, send_all
from .redis_clients import (
    REDIS_ERRORS,
    AsyncClient,
    Clients,
    Head,
    SyncClient,
    Unavailable,
    retried_alone,
    unavailable,
)
from .redis_codec import CODECS, Args, loops_key_of
from .redis_events import RedisEventLog

__all__ = ["RedisStore"]

_DEFAULT_TTL = 14 * 86_400.0

R = TypeVar("R")


class RedisStore:
    """State shared through Redis (standalone, Sentinel or Cluster), sync and asyncio.

    >>> store = RedisStore(redis.Redis())                        # doctest: +SKIP
    >>> store = RedisStore.from_url("redis://localhost:6379/0")  # doctest: +SKIP
    >>> fuse = Fuse(store)                                       # doctest: +SKIP

    Args:
        client: a ``redis.Redis`` or ``redis.cluster.RedisCluster`` (for ``run``), or their
            ``redis.asyncio`` counterparts (for ``arun``). The caller keeps owning it.
        prefix: first part of every key; must not contain ``{`` or ``}``.
        clock: ``None`` for the server's clock; a callable returning epoch seconds otherwise.
        ttl: seconds an idle identity's state lives.
        open_keys: answer gates from a local view of the open keys (``open_keys``).
    """

    def __init__(
        self,
        client: SyncClient | AsyncClient,
        *,
        prefix: str = "tokenfuse",
        clock: Callable[[], float] | None = None,
        ttl: float = _DEFAULT_TTL,
        open_keys: bool = True,
    ) -> None:
        self._setup(Clients.wrap(client), prefix, clock, ttl, open_keys)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "tokenfuse",
        clock: Callable[[], float] | None = None,
        ttl: float = _DEFAULT_TTL,
        cluster: bool = False,
        open_keys: bool = True,
        **options: Any,
    ) -> RedisStore:
        """A store with its own sync and asyncio clients, each built at its first use.

        ``redis+cluster://host:port`` (or ``cluster=True``) makes them cluster clients.
        ``options`` go to redis-py; the defaults bound what a decision waits
        (``redis_budget``): 0.25 s for an answer, 1 s to connect, a blocking pool of 50
        connections waited on for at most 2 s, one immediate retry on a connection error.

        >>> store = RedisStore.from_url("redis+cluster://10.0.0.5:7000")  # doctest: +SKIP
        """
        store = cls.__new__(cls)
        clients = Clients.from_url(url, cluster=cluster, options=options)
        store._setup(clients, prefix, clock, ttl, open_keys)
        return store

    def _setup(
        self,
        clients: Clients,
        prefix: str,
        clock: Callable[[], float] | None,
        ttl: float,
        open_keys: bool,
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
        #: Operator events of every fuse on this store, shared by every process (a Stream).
        self.events = RedisEventLog(clients, prefix, self._ttl_ms)
        #: The local view of open keys (None: every gate is a round trip).
        self.open_keys = (
            OpenKeys(clients.subscriber_client, prefix=prefix, clock=clock)
            if open_keys and clients.has_sync
            else None
        )

    def __repr__(self) -> str:
        described = self._clients.described
        return f"RedisStore(prefix={self.prefix!r}, {described}, scripts={self.scripts})"

    @property
    def scripts(self) -> str:
        """How the server runs the decisions: "functions" (FCALL of tokenfuse's library), or
        "evalsha" once a server showed it cannot (Redis < 7, FCALL or FUNCTION renamed or
        denied to the user); ``scripts_reason`` says why."""
        return self._clients.scripts

    @property
    def scripts_reason(self) -> str:
        """Why the decisions are EVALSHA scripts: the server's answer ("" with functions)."""
        return self._clients.scripts_reason

    @property
    def has_sync(self) -> bool:
        """Whether ``run`` works (a sync client was given, or built from a URL)."""
        return self._clients.has_sync

    @property
    def has_async(self) -> bool:
        """Whether ``arun`` works (an asyncio client was given, or built from a URL)."""
        return self._clients.has_async

    def close(self) -> None:
        """Stop the open-key view; close the sync client this store built (``from_url``), a
        given client stays open."""
        if self.open_keys is not None:
            self.open_keys.close()
        self._clients.close()

    async def aclose(self) -> None:
        """Stop the open-key view; close every client this store built (``from_url``), once
        the event log's pending writes are done."""
        if self.open_keys is not None:
            self.open_keys.close()
        await self.events.aflush()
        await self._clients.aclose()

    # -- one operation = one script call; both faces encode and decode it the same way --------

    def run(self, op: Op[R]) -> R:
        """Run one operation (``ops``) with its script; needs a sync client."""
        if type(op) is ListKeys:  # many keys, no script (``redis_listing``)
            client = self._clients.sync_client()
            with Unavailable(op.name):
                page = redis_listing.run_sync(client, op, self.prefix, self._now())
            return cast(R, page)
        key, known = self._known(op)
        if known is not None:
            return known
        return self._send(op, key)

    async def arun(self, op: Op[R]) -> R:
        """Run one operation (``ops``) with its script; needs an asyncio client."""
        if type(op) is ListKeys:
            client = self._clients.async_client()
            with Unavailable(op.name):
                page = await redis_listing.run_async(client, op, self.prefix, self._now())
            return cast(R, page)
        key, known = self._known(op)
        if known is not None:
            return known
        return await self._asend(op, key)

    # The decisions' path: a plain ``try`` rather than an ``Unavailable`` block, which would
    # cost an object and two calls per decision.

    def _send(self, op: Op[R], key: str) -> R:
        """One operation's script call, its key already made (``_known``)."""
        script = self._clients.sync_scripts()[op.name]
        try:
            reply = script((key,), self._args(op))
        except REDIS_ERRORS as exc:
            raise unavailable(op.name, exc) from exc
        return self._result(op, key, reply)

    async def _asend(self, op: Op[R], key: str) -> R:
        """``_send`` for asyncio code."""
        script = self._clients.async_scripts()[op.name]
        try:
            reply = await script((key,), self._args(op))
        except REDIS_ERRORS as exc:
            raise unavailable(op.name, exc) from exc
        return self._result(op, key, reply)

    def run_many(self, ops: Sequence[Op[Any]]) -> list[Any]:
        """Run several operations in one round trip, each its own script call, in order;
        their results in the same order. A gate the open-key view answers is not sent (no
        round trip at all when it was the only one); one operation left to send is one plain
        script call, several are sent together (``redis_batch``). Needs a sync client."""
        known, keys, sending = self._known_many(ops)
        if len(sending) <= 1:
            sent = [self._send(op, key) for op, key in zip(sending, keys, strict=True)]
            return _merged(known, sent)
        commands = self._commands(sending, keys, self._clients.sync_heads())
        with Unavailable("batch"):
            replies = send_all(self._clients.sync_client(), commands)
            scripts = self._clients.sync_scripts()
            for at in _missing_scripts(replies):  # run alone: it loads what is missing
                replies[at] = scripts[sending[at].name]((keys[at],), self._args(sending[at]))
        return _merged(known, self._results(sending, keys, replies))

    async def arun_many(self, ops: Sequence[Op[Any]]) -> list[Any]:
        """``run_many`` for asyncio code."""
        known, keys, sending = self._known_many(ops)
        if len(sending) <= 1:
            sent = [await self._asend(op, key) for op, key in zip(sending, keys, strict=True)]
            return _merged(known, sent)
        commands = self._commands(sending, keys, self._clients.async_heads())
        with Unavailable("batch"):
            replies = await asend_all(self._clients.async_client(), commands)
            scripts = self._clients.async_scripts()
            for at in _missing_scripts(replies):
                replies[at] = await scripts[sending[at].name]((keys[at],), self._args(sending[at]))
        return _merged(known, self._results(sending, keys, replies))

    def _known_many(self, ops: Sequence[Op[Any]]) -> tuple[list[Any], list[str], list[Op[Any]]]:
        """What the open-key view answers (None where it does not), and the ops to send with
        their keys."""
        known: list[Any] = []
        keys: list[str] = []
        sending: list[Op[Any]] = []
        for op in ops:
            key, answer = self._known(op)
            known.append(answer)
            if answer is None:
                keys.append(key)
                sending.append(op)
        return known, keys, sending

    def _commands(
        self, ops: Sequence[Op[Any]], keys: Sequence[str], heads: dict[str, Head]
    ) -> list[Command]:
        """The operations' calls: FCALLs, or EVALSHAs (``redis_clients.ServerScripts``)."""
        return [
            (*heads[op.name], 1, key, *self._args(op)) for op, key in zip(ops, keys, strict=True)
        ]

    def _results(self, ops: Sequence[Op[Any]], keys: list[str], replies: list[Any]) -> list[Any]:
        return [self._result(*each) for each in zip(ops, keys, replies, strict=True)]

    def known(self, op: Op[R]) -> R | None:
        """``op``'s result when the open-key view answers it without a round trip (a loop check
        whose caller allows it: ``CheckLoops.local``), else None: send it. A miss is not
        counted here: the caller sends the operation (``arun_many``), which counts it once.
        ``Fuse.admit_with`` asks first, so that an admission whose check is answered here is
        sent as one plain script call, as it is without the check."""
        view = self.open_keys
        if view is None or not isinstance(op, CheckLoops) or not op.local:
            return None
        return cast(R, view.known_loop(loops_key_of(self.prefix, op.key), op.fingerprint))

    def _known(self, op: Op[R]) -> tuple[str, R | None]:
        """The operation's Redis key, and its result if the open-key view knows it (a gate, or
        a loop check whose caller allows it: ``CheckLoops.local``)."""
        key = CODECS[type(op)].key(self.prefix, op.key)
        view = self.open_keys
        if view is not None:
            kind = type(op)
            if kind is Gate:
                known: Any = view.answer(key)  # a Gate's result is a VelocityVerdict
                return key, known
            if kind is CheckLoops and cast(CheckLoops, op).local:
                return key, cast(R, view.answer_loop(key, cast(CheckLoops, op).fingerprint))
        return key, None

    def _args(self, op: Op[Any]) -> Args:
        now = "" if self.clock is None else repr(float(self.clock()))
        return CODECS[type(op)].args(op, now, self._ttl_ms)

    def _now(self) -> float | None:
        return None if self.clock is None else float(self.clock())

    def _result(self, op: Op[R], key: str, reply: Any) -> R:
        result: R = CODECS[type(op)].result(op, reply)
        if self.open_keys is not None:
            self.open_keys.learn(op, key, result)
        return result


def _merged(known: list[Any], sent: list[Any]) -> list[Any]:
    """The results in the operations' order: the view's answers, the replies in the gaps."""
    replies = iter(sent)
    return [next(replies) if answer is None else answer for answer in known]


def _missing_scripts(replies: list[Any]) -> Iterator[int]:
    """The replies of a pipeline that failed for want of their script or function (the server
    restarted or flushed them, or runs no functions: ``redis_clients.retried_alone``); any
    other error is raised."""
    for at, reply in enumerate(replies):
        if retried_alone(reply):
            yield at
        elif isinstance(reply, Exception):
            raise reply
