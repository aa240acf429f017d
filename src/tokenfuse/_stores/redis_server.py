"""What the Redis server will do with tokenfuse's keys when its memory is full.

Read once per client, after its first decision succeeds (``CONFIG GET maxmemory*``; where
CONFIG is disabled, renamed or not permitted, ``INFO memory``), on every primary of a cluster.
Every tokenfuse key has a TTL (14 days by default, renewed by each decision that writes it).
When Redis reaches ``maxmemory``:

* ``allkeys-lru``, ``allkeys-lfu``, ``allkeys-random`` evict keys whatever their TTL or use,
  tokenfuse's too: a tripped key silently closes, an empty bucket refills, a live
  ``set_limit`` is forgotten. Warned about.
* ``noeviction`` refuses writes: every decision errors and fails open (or closed). Warned
  about when a ``maxmemory`` is set (without one, Redis grows until the machine runs out).
* ``volatile-ttl`` (recommended) evicts the keys nearest their expiry first: short-lived
  cache entries before tokenfuse's keys, and among tokenfuse's the identities idle longest,
  while a key that tripped or was limited recently was written recently and goes last.
  ``volatile-lru`` is close behind (least recently used first). Keys without a TTL are
  never evicted by either.

See ``docs/operations.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio.cluster
import redis.cluster

__all__ = ["MemoryPolicy", "acheck_server", "check_server", "memory_advice"]

logger = logging.getLogger("tokenfuse")

RECOMMENDED = "volatile-ttl"
_EVICTS_ANY_KEY = {"allkeys-lru", "allkeys-lfu", "allkeys-random"}


@dataclass(frozen=True, slots=True)
class MemoryPolicy:
    """One server's ``maxmemory-policy`` and ``maxmemory`` (bytes, 0 for none)."""

    node: str  # "host:port" of a cluster primary, "" for a standalone server
    policy: str
    maxmemory: int


def memory_advice(server: MemoryPolicy) -> str | None:
    """What is wrong with a server's memory policy for tokenfuse, and the setting to use.

    >>> memory_advice(MemoryPolicy("", "allkeys-lru", 0)) is not None
    True
    >>> memory_advice(MemoryPolicy("", "volatile-ttl", 2**30)) is None
    True
    """
    where = f"Redis {server.node}" if server.node else "Redis"
    fix = (
        f"set maxmemory-policy {RECOMMENDED} (or volatile-lru): every tokenfuse key has a "
        "TTL, so those evict cache entries and idle identities first"
    )
    if server.policy in _EVICTS_ANY_KEY:
        return (
            f"{where} has maxmemory-policy {server.policy}: when memory is full it evicts "
            "tokenfuse's keys like any other, silently closing tripped keys, refilling "
            f"buckets and dropping live limits; {fix}"
        )
    if server.policy == "noeviction" and server.maxmemory > 0:
        return (
            f"{where} has maxmemory-policy noeviction with maxmemory {server.maxmemory}: "
            "when memory is full it refuses tokenfuse's writes and every decision fails "
            f"open; {fix}"
        )
    return None


def check_server(client: Any) -> list[MemoryPolicy]:
    """Log what the server's memory policy will do to tokenfuse's keys; the policies read
    (none if they could not be). Never raises."""
    try:
        try:
            found = _policies(client, client.config_get("maxmemory*", **_targets(client)))
        except redis.ResponseError:  # CONFIG disabled, renamed or not permitted
            found = _policies(client, client.info("memory", **_targets(client)))
    except Exception as exc:
        return _unread(exc)
    return _warn(found)


async def acheck_server(client: Any) -> list[MemoryPolicy]:
    """``check_server`` through an asyncio client."""
    try:
        try:
            reply = await client.config_get("maxmemory*", **_targets(client))
        except redis.ResponseError:
            reply = await client.info("memory", **_targets(client))
        found = _policies(client, reply)
    except Exception as exc:
        return _unread(exc)
    return _warn(found)


def _targets(client: Any) -> dict[str, str]:
    clusters = (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)
    return {"target_nodes": "primaries"} if isinstance(client, clusters) else {}


def _policies(client: Any, reply: Mapping[Any, Any]) -> list[MemoryPolicy]:
    """Both replies (CONFIG GET and INFO), standalone or per cluster node, as policies."""
    clusters = (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)
    if isinstance(client, clusters) and all(isinstance(v, Mapping) for v in reply.values()):
        per_node = {_text(node): fields for node, fields in reply.items()}
    else:
        per_node = {"": reply}
    return [_policy(node, fields) for node, fields in per_node.items()]


def _policy(node: str, fields: Mapping[Any, Any]) -> MemoryPolicy:
    values = {_text(name).replace("_", "-"): _text(value) for name, value in fields.items()}
    return MemoryPolicy(node, values["maxmemory-policy"], int(values.get("maxmemory") or 0))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _unread(exc: Exception) -> list[MemoryPolicy]:
    logger.info(
        "tokenfuse: could not read the Redis maxmemory-policy (%s); make sure it is %s, "
        "see docs/operations.md",
        exc,
        RECOMMENDED,
    )
    return []


def _warn(found: list[MemoryPolicy]) -> list[MemoryPolicy]:
    for server in found:
        advice = memory_advice(server)
        if advice is not None:
            logger.warning("tokenfuse: %s", advice)
    return found
