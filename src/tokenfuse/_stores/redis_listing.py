"""How ``RedisStore`` runs ``ListKeys``: ``SCAN`` on every primary, then the states in batches.

Nothing is indexed for listing (the hot path writes one string per decision and nothing else),
so a page walks the keyspace: ``SCAN MATCH <prefix>:{<op.key>*`` on one primary after another
(a standalone server is one), at most ``_SCANS_PER_PAGE`` calls per page so that a page's work
is bounded however large the database; then one pipelined ``GET`` per node for the keys found,
decoded with the state layout of ``redis_codec`` and viewed through the core
(``status_of``), as ``ReadStatus`` is.

The walk is written once, as steps (``walk`` yields each command and receives its reply), and
the sync and asyncio faces only carry the commands out (``run_sync``, ``run_async``).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from functools import partial
from typing import Any

from .._core.status import status_of
from .ops import KeyPage, ListKeys
from .redis_codec import states_of

__all__ = ["Fetch", "Now", "Scan", "run_async", "run_sync", "walk"]

# A page stops after this many SCAN calls even if it found fewer keys than asked for: its
# cursor says where the next page goes on.
_SCANS_PER_PAGE = 64


@dataclass(frozen=True, slots=True)
class Scan:
    """One ``SCAN`` on one node (None: the standalone server): reply ``(cursor, keys)``."""

    node: str | None
    cursor: int
    match: str
    count: int


@dataclass(frozen=True, slots=True)
class Fetch:
    """Pipelined ``GET`` of ``keys`` (raw bytes, never decoded): reply the values in order."""

    keys: list[str]


@dataclass(frozen=True, slots=True)
class Now:
    """The server's clock: reply epoch seconds."""


Step = Scan | Fetch | Now


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def _cursor(text: str, nodes: list[str | None]) -> tuple[int, int]:
    """(index of the node to scan, SCAN cursor on it) from a page's cursor ``node/cursor``."""
    if not text:
        return 0, 0
    node, _, cursor = text.rpartition("/")
    for index, name in enumerate(nodes):
        if (name or "") == node:
            return index, int(cursor)
    return len(nodes), 0  # the node is gone (the cluster changed): nothing left there


def walk(
    op: ListKeys, prefix: str, nodes: list[str | None], clock: float | None
) -> Generator[Step, Any, KeyPage]:
    """The steps of one page; returns it. ``nodes``: every primary's name (None for a
    standalone server), sorted, so that a cursor names the node it goes on with."""
    index, cursor = _cursor(op.cursor, nodes)
    match = f"{_glob_escape(prefix)}:{{{_glob_escape(op.key)}*"
    found: dict[str, None] = {}  # one SCAN may return a key twice: keep each once, in order
    for _ in range(_SCANS_PER_PAGE):
        if index >= len(nodes) or len(found) >= op.count:
            break
        cursor, keys = yield Scan(nodes[index], cursor, match, max(op.count, 10))
        found.update(dict.fromkeys(k.decode() if isinstance(k, bytes) else k for k in keys))
        if cursor == 0:
            index, cursor = index + 1, 0
    next_cursor = f"{nodes[index] or ''}/{cursor}" if index < len(nodes) else ""
    names = list(found)
    if not names:
        return KeyPage([], next_cursor)
    values = yield Fetch(names)
    now = clock if clock is not None else (yield Now())
    start = len(prefix) + 2  # "<prefix>:{"
    statuses = []
    for name, raw in zip(names, values, strict=True):
        if raw is None:
            continue  # expired or reset since the SCAN
        velocity, bucket = states_of(raw)
        key = name[start:-1]
        statuses.append(status_of(key, velocity, bucket, now, op.velocity, op.bucket))
    return KeyPage(statuses, next_cursor)


def _clock(reply: Any) -> float:
    seconds, micros = reply
    return int(seconds) + int(micros) / 1e6


def _from_one_node(reply: Any) -> Any:
    cursors, keys = reply  # a cluster client answers ({node name: cursor}, keys)
    return next(iter(cursors.values())), keys


def _as_is(reply: Any) -> Any:
    return reply


def _command(client: Any, nodes: dict[str, Any] | None, step: Step) -> tuple[Any, Any]:
    """(the client call that carries ``step`` out, what turns its answer into the reply)."""
    from redis.client import NEVER_DECODE

    if isinstance(step, Scan):
        scan = partial(client.scan, step.cursor, match=step.match, count=step.count)
        if nodes is None:
            return scan, _as_is
        return partial(scan, target_nodes=nodes[str(step.node)]), _from_one_node
    if isinstance(step, Fetch):
        pipe = client.pipeline(transaction=False) if nodes is None else client.pipeline()
        for key in step.keys:
            pipe.execute_command("GET", key, **{NEVER_DECODE: []})  # queued, not sent
        return pipe.execute, _as_is
    return client.time, _clock


def _primaries(client: Any) -> tuple[list[str | None], dict[str, Any] | None]:
    """Every primary's name, sorted, and the nodes by name; ``[None], None`` when standalone."""
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
    from redis.cluster import RedisCluster

    if not isinstance(client, (RedisCluster, AsyncRedisCluster)):
        return [None], None
    nodes = {node.name: node for node in client.get_primaries()}
    return sorted(nodes), nodes


class _Walk:
    """One page's steps, each turned into the client call that carries it out."""

    def __init__(self, client: Any, op: ListKeys, prefix: str, clock: float | None) -> None:
        names, self._nodes = _primaries(client)
        self._client = client
        self._steps = walk(op, prefix, names, clock)

    def advance(self, reply: Any) -> tuple[Any, Any] | KeyPage:
        """The next (call, shape of its answer), or the page once the steps are done."""
        try:
            step = self._steps.send(reply)
        except StopIteration as done:
            page: KeyPage = done.value
            return page
        return _command(self._client, self._nodes, step)


def run_sync(client: Any, op: ListKeys, prefix: str, clock: float | None) -> KeyPage:
    """One page of ``op``, walked with a sync redis-py client."""
    steps, reply = _Walk(client, op, prefix, clock), None
    while not isinstance(step := steps.advance(reply), KeyPage):
        call, shape = step
        reply = shape(call())
    return step


async def run_async(client: Any, op: ListKeys, prefix: str, clock: float | None) -> KeyPage:
    """One page of ``op``, walked with an asyncio redis-py client."""
    if hasattr(client, "initialize"):
        await client.initialize()  # an asyncio cluster client learns its nodes on first use
    steps, reply = _Walk(client, op, prefix, clock), None
    while not isinstance(step := steps.advance(reply), KeyPage):
        call, shape = step
        reply = shape(await call())
    return step
