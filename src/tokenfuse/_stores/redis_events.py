"""The event log of a ``RedisStore``: a capped Redis Stream that every process shares.

* **Stream** ``<prefix>:events``, one entry per event (``LoggedEvent.fields``), appended with
  ``XADD … MAXLEN ~ maxlen`` (10,000 by default: Redis trims whole nodes of the stream, so
  it holds at least that many and a few more). Events are rare (trips, near-limit episodes,
  resets, live configuration, outages), so this is no write per decision.
* **Labels** ``<prefix>:labels:<fuse>:<key id>``: the label of a key that had an event about
  it, with the store's TTL, so a listing can show ``sk-…9c21`` next to ``3f9a0c12ab45``.

Appending never raises and never waits on a store that is failing: an outage's own event
(``store_unavailable``, ``pool_exhausted``) is held back, with anything that failed to be
written, and written before the next event (``store_recovered``, usually). A write is one
pipelined round trip on the sync client, made by the decision that tripped (the one that
pays for it, once per trip); a store with an asyncio client only writes from a task of the
running loop instead.

Readers block with ``XREAD BLOCK`` on a client of their own whose timeout is long enough
(``READER_TIMEOUT``, for a store built from a URL), each wait bounded to end well within it,
so a blocking read never looks like a dead server; on a caller's client with a short timeout
they read without blocking, five times a second.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from .._events import FuseEvent, Hook, logger
from .._plans import Plan, adrive, drive
from .event_log import OUTAGE_KINDS, LoggedEvent, remember_label
from .redis_budget import command_timeout
from .redis_clients import REDIS_ERRORS, Clients, Unavailable

__all__ = ["DEFAULT_MAXLEN", "RedisEventLog"]

#: A client call: its reply, or an awaitable of it for an asyncio client.
Step = Callable[[Any], Any]

#: Entries the stream keeps (about; ``MAXLEN ~``).
DEFAULT_MAXLEN = 10_000

#: Events held back while they cannot be written; the oldest go first past this.
_HELD = 100

#: How late Redis may answer a blocked read after its timeout, and how often a client that
#: cannot block long reads instead.
_SERVER_LATENESS = 0.5
_POLL = 0.2


#: An event to write, with its label's key and the label when it teaches one.
Entry = tuple[LoggedEvent, tuple[str, str] | None]


def _is_cluster(client: Any) -> bool:
    return isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))


def _pipeline(client: Any) -> Any:
    """A pipeline without MULTI/EXEC: a cluster client's sends each command to its key's node."""
    return client.pipeline() if _is_cluster(client) else client.pipeline(transaction=False)


def _xread(client: Any, *, streams: dict[str, str], count: int, block: int | None) -> Any:
    return client.xread(streams, count=count, block=block)


def _pause(seconds: float, client: Any) -> Any:
    """Wait ``seconds``: awaitable for an asyncio client (a step of a read plan)."""
    if isinstance(client, (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)):
        return asyncio.sleep(max(seconds, 0.0))
    time.sleep(max(seconds, 0.0))
    return None


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _entries(reply: Sequence[Any]) -> list[LoggedEvent]:
    """Stream entries (``[(id, {field: value})]``) as events."""
    return [
        LoggedEvent.from_fields(_text(id), {_text(k): _text(v) for k, v in fields.items()})
        for id, fields in reply
    ]


def _stream_entries(reply: Any) -> list[LoggedEvent]:
    """XREAD's reply (RESP2: ``[[stream, entries]]``; RESP3: ``{stream: [entries]}``)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [event for entries in reply.values() for event in _entries(entries[0])]
    return [event for _, entries in reply for event in _entries(entries)]


class RedisEventLog:
    """``RedisStore.events``: see the module's description.

    >>> store.events.recent(20)   # doctest: +SKIP
    [LoggedEvent(id='1767225600000-0', kind='tripped', fuse='default', ...)]
    """

    def __init__(
        self, clients: Clients, prefix: str, ttl_ms: str, maxlen: int = DEFAULT_MAXLEN
    ) -> None:
        self.stream = f"{prefix}:events"
        self._labels = f"{prefix}:labels"
        self._clients = clients
        self._ttl_ms = ttl_ms
        self.maxlen = maxlen
        self._held: deque[Entry] = deque(maxlen=_HELD)
        self._lock = threading.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    def _label_key(self, fuse: str, key_id: str) -> str:
        return f"{self._labels}:{fuse}:{key_id}"

    # -- writing ------------------------------------------------------------------------------

    def recorder(self, fuse: str) -> Hook:
        return partial(self.append, fuse=fuse)

    def append(self, event: FuseEvent, fuse: str) -> None:
        """Log ``event`` of the fuse ``fuse`` (a hook: never raises)."""
        labelled: list[tuple[str, str]] = []
        remember_label(
            event, fuse, lambda key, label: labelled.append((self._label_key(*key), label))
        )
        with self._lock:
            self._held.append((LoggedEvent.of(event, fuse), labelled[0] if labelled else None))
            if event.kind in OUTAGE_KINDS:
                return  # the store is failing: write it with the next event
            batch = list(self._held)
            self._held.clear()
        if self._clients.has_sync:
            self._write(batch)
            return
        try:  # an asyncio client only: a task of the running loop writes it
            task = asyncio.get_running_loop().create_task(self._awrite(batch))
        except RuntimeError:  # no loop runs: the next event will take it
            self._hold(batch)
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send(self, client: Any, batch: list[Entry]) -> Any:
        """One pipeline of the batch's XADDs and label SETs (awaitable for an asyncio client)."""
        pipe = _pipeline(client)
        for event, label in batch:
            pipe.xadd(self.stream, event.fields(), maxlen=self.maxlen, approximate=True)
            if label is not None:
                pipe.set(label[0], label[1], px=int(self._ttl_ms))
        return pipe.execute()

    def _write(self, batch: list[Entry]) -> None:
        try:
            self._send(self._clients.sync_client(), batch)
        except REDIS_ERRORS as exc:
            self._failed(batch, exc)

    async def _awrite(self, batch: list[Entry]) -> None:
        try:
            await self._send(self._clients.async_client(), batch)
        except REDIS_ERRORS as exc:
            self._failed(batch, exc)

    def _failed(self, batch: list[Entry], exc: Exception) -> None:
        logger.debug("tokenfuse could not log %d event(s) to %s: %s", len(batch), self.stream, exc)
        self._hold(batch)

    def _hold(self, batch: list[Entry]) -> None:
        with self._lock:
            self._held.extendleft(reversed(batch))

    async def aflush(self) -> None:
        """Wait for the writes started in asyncio code (``RedisStore.aclose`` does)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    # -- reading: each a plan of one command, run by the sync or the asyncio client -----------

    def _sync(self, plan: Plan[Step, Any], blocking: bool = False) -> Any:
        with Unavailable("events"):
            clients = self._clients
            client = clients.sync_reader() if blocking else clients.sync_client()
            return drive(plan, lambda step: step(client))

    async def _async(self, plan: Plan[Step, Any], blocking: bool = False) -> Any:
        with Unavailable("events"):
            clients = self._clients
            client = clients.async_reader() if blocking else clients.async_client()
            return await adrive(plan, lambda step: step(client))

    def _recent(self, count: int) -> Plan[Step, list[LoggedEvent]]:
        reply = yield lambda client: client.xrevrange(self.stream, count=max(count, 1))
        return list(reversed(_entries(reply))) if count > 0 else []

    def recent(self, count: int) -> list[LoggedEvent]:
        result: list[LoggedEvent] = self._sync(self._recent(count))
        return result

    async def arecent(self, count: int) -> list[LoggedEvent]:
        result: list[LoggedEvent] = await self._async(self._recent(count))
        return result

    def _since(self, start: float, count: int) -> Plan[Step, list[LoggedEvent]]:
        first = f"{max(int(start * 1000), 0)}-0"  # entry ids are the server's milliseconds
        reply = yield lambda client: client.xrange(self.stream, min=first, count=max(count, 1))
        return _entries(reply)

    def since(self, start: float, count: int) -> list[LoggedEvent]:
        result: list[LoggedEvent] = self._sync(self._since(start, count))
        return result

    async def asince(self, start: float, count: int) -> list[LoggedEvent]:
        result: list[LoggedEvent] = await self._async(self._since(start, count))
        return result

    def _read(self, after: str, count: int, block: float) -> Plan[Step, list[LoggedEvent]]:
        """XREAD, blocking on the server for as long as the client's timeout allows: a
        ``READER_TIMEOUT`` client (a store built from a URL) waits on the server; a caller's
        client with a short timeout reads without blocking, every ``_POLL`` seconds."""
        deadline = time.monotonic() + max(block, 0.0)
        timeout: float | None = yield command_timeout
        # Redis notices a blocked read's timeout on its next tick (1/hz, 0.1 s by default):
        # leave room for that and the round trip.
        most = math.inf if timeout is None else timeout - _SERVER_LATENESS
        streams = {self.stream: after or "0-0"}
        while True:
            remaining = deadline - time.monotonic()
            wait = max(int(min(remaining, most) * 1000), 0)  # BLOCK 0 waits for ever: none
            reply = yield partial(_xread, streams=streams, count=count, block=wait or None)
            events = _stream_entries(reply)
            if events or time.monotonic() >= deadline:
                return events
            if wait <= 0:
                yield partial(_pause, min(_POLL, deadline - time.monotonic()))

    def read(self, after: str, count: int, block: float) -> list[LoggedEvent]:
        result: list[LoggedEvent] = self._sync(self._read(after, count, block), blocking=True)
        return result

    async def aread(self, after: str, count: int, block: float) -> list[LoggedEvent]:
        plan = self._read(after, count, block)
        result: list[LoggedEvent] = await self._async(plan, blocking=True)
        return result

    def _labels_of(self, fuse: str, key_ids: Sequence[str]) -> Plan[Step, dict[str, str]]:
        if not key_ids:
            return {}
        names = [self._label_key(fuse, key_id) for key_id in key_ids]

        def get(client: Any) -> Any:
            return client.mget_nonatomic(names) if _is_cluster(client) else client.mget(names)

        values = yield get
        return {
            key_id: _text(value) for key_id, value in zip(key_ids, values, strict=True) if value
        }

    def labels(self, fuse: str, key_ids: Sequence[str]) -> dict[str, str]:
        result: dict[str, str] = self._sync(self._labels_of(fuse, key_ids))
        return result

    async def alabels(self, fuse: str, key_ids: Sequence[str]) -> dict[str, str]:
        result: dict[str, str] = await self._async(self._labels_of(fuse, key_ids))
        return result
