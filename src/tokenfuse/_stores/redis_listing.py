"""Listing identities in Redis: SCAN on each primary in turn, then the page's states in one
batched read, decoded here with the codec's layout (``states_of``).

No script and no index: SCAN cannot run inside a script, and keeping an index would cost a
write on every decision. A listing is a plan (``_plans``) of client calls, so ``run`` and
``arun`` share it. The cursor says where the next page starts: ``"<node>:<SCAN cursor>"``,
the node being the index of a primary in the cluster's primaries sorted by address (one, for
a standalone server).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import redis.asyncio.cluster
import redis.cluster
from redis.client import NEVER_DECODE

from .._errors import ConfigurationError
from .._plans import Plan
from .ops import KeyPage, KeyState, ListKeys, Op
from .redis_codec import states_of

__all__ = ["PLANS", "Step", "is_cluster", "list_plan", "pipeline", "seconds"]

#: A client call: its reply, or an awaitable of it for an asyncio client.
Step = Callable[[Any], Any]

_GLOB = re.compile(r"([*?\[\]\\])")


def _glob_escaped(text: str) -> str:
    return _GLOB.sub(r"\\\1", text)


def _sorted(nodes: Sequence[Any]) -> list[Any]:
    return sorted(nodes, key=lambda node: node.name)


async def _cluster_primaries(client: redis.asyncio.cluster.RedisCluster) -> list[Any]:
    await client.initialize()  # an asyncio cluster client learns its nodes on first use
    return _sorted(client.get_primaries())


def _primaries(client: Any) -> Any:
    """The nodes to scan: every primary of a cluster, or None for the one server."""
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        return _cluster_primaries(client)
    if isinstance(client, redis.cluster.RedisCluster):
        return _sorted(client.get_primaries())  # type: ignore[no-untyped-call]
    return [None]


def is_cluster(client: Any) -> bool:
    return isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))


def pipeline(client: Any) -> Any:
    """A pipeline without MULTI/EXEC: a cluster client's sends each command to its key's node."""
    return client.pipeline() if is_cluster(client) else client.pipeline(transaction=False)


def _on(node: Any) -> dict[str, Any]:
    return {} if node is None else {"target_nodes": node}


def _scan(client: Any, *, node: Any, cursor: int, match: str, count: int) -> Any:
    return client.scan(cursor, match=match, count=count, **_on(node))


def _get_many(client: Any, *, names: Sequence[str]) -> Any:
    """The strings at ``names`` as bytes, whatever the client's ``decode_responses``."""
    if is_cluster(client):
        pipe = pipeline(client)  # one GET per key: each is in a slot of its own
        for name in names:
            pipe.execute_command("GET", name, **{NEVER_DECODE: []})
        return pipe.execute()
    return client.execute_command("MGET", *names, **{NEVER_DECODE: []})


def _time(client: Any, *, node: Any) -> Any:
    return client.time(**_on(node))


def seconds(reply: Sequence[int]) -> float:
    """A ``TIME`` reply as epoch seconds."""
    return int(reply[0]) + int(reply[1]) / 1e6


def _position(cursor: str, nodes: int) -> tuple[int, int]:
    if not cursor:
        return 0, 0
    node, _, position = cursor.partition(":")
    if not (node.isdigit() and position.isdigit() and int(node) < nodes):
        raise ConfigurationError(f"not a listing cursor of this store: {cursor!r}")
    return int(node), int(position)


def list_plan(op: ListKeys, prefix: str, clock: Callable[[], float] | None) -> Plan[Step, KeyPage]:
    """One page of ``op``: SCAN once on one primary, read the states found, and say where
    the next page starts (the same primary, the next one, or nowhere)."""
    nodes: list[Any] = yield _primaries
    index, position = _position(op.cursor, len(nodes))
    head = f"{prefix}:{{"
    match = f"{_glob_escaped(head + op.prefix)}*}}"
    reply = yield partial(
        _scan, node=nodes[index], cursor=position, match=match, count=max(op.count, 1)
    )
    found, names = reply
    # A cluster client answers {node: cursor}; a standalone one the cursor alone.
    following = int(next(iter(found.values())) if isinstance(found, dict) else found)
    names = [name.decode() if isinstance(name, bytes) else name for name in names]
    blobs = (yield partial(_get_many, names=names)) if names else []
    now = clock() if clock is not None else seconds((yield partial(_time, node=nodes[index])))
    states = []
    for name, blob in zip(names, blobs, strict=True):
        velocity, bucket = states_of(blob) if blob else (None, None)
        if velocity is not None or bucket is not None:  # expired since the SCAN, or not ours
            states.append(KeyState(name[len(head) : -1], now, velocity, bucket))
    if following:
        return KeyPage(states, f"{index}:{following}")
    return KeyPage(states, f"{index + 1}:0" if index + 1 < len(nodes) else None)


#: The operations ``RedisStore`` runs as plans of client calls rather than scripts.
PLANS: dict[type[Op[Any]], Callable[[Any, str, Callable[[], float] | None], Plan[Step, Any]]] = {
    ListKeys: list_plan,
}
