"""Several commands in one round trip (``redis_batch``): the replies in order, error replies in
their places, and a pooled connection never left with a reply unread; ``RedisStore.run_many``
over it, NOSCRIPT included."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
import redis.asyncio
from redis.exceptions import NoScriptError, ResponseError

from tests.stores.conftest import OwnRedis
from tokenfuse import BucketPolicy, VelocityPolicy
from tokenfuse._core.loops import LoopPolicy
from tokenfuse._stores.ops import Admit, CheckLoops
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_batch import asend_all, send_all

pytestmark = pytest.mark.redis

MISSING = "0" * 40  # the SHA1 of no script the server has
VELOCITY = VelocityPolicy(limit=1e9)
BUCKET = BucketPolicy(rate=1000, capacity=1000)
LOOPS = LoopPolicy()
MARK = "0123456789abcdef"


def test_replies_come_in_order_with_errors_in_their_places(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        replies = send_all(client, [("PING",), ("EVALSHA", MISSING, 0), ("ECHO", "after")])
        assert replies[0] is True or replies[0] == b"PONG"
        assert isinstance(replies[1], NoScriptError)
        assert replies[2] == b"after"
        assert send_all(client, [("ECHO", "next")]) == [b"next"]  # nothing left unread


async def test_async_replies_come_in_order_with_errors_in_their_places(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        wrong = ("HGET", "k")  # the wrong number of arguments
        replies = await asend_all(client, [wrong, ("EVALSHA", MISSING, 0), ("ECHO", "after")])
        assert type(replies[0]) is ResponseError and isinstance(replies[1], NoScriptError)
        assert replies[2] == b"after"
        assert await asend_all(client, [("ECHO", "next")]) == [b"next"]
    finally:
        await client.aclose()


async def test_a_cancelled_batch_leaves_no_reply_for_the_next(redis_url: str) -> None:
    """Cancelled while its reply is awaited (a BLPOP the server holds), the connection goes
    back to the pool closed: the next batch on the one pooled connection reads its own reply,
    not the stale one."""
    name = f"tokenfuse-test-{uuid.uuid4().hex[:8]}"
    pool = redis.asyncio.ConnectionPool.from_url(redis_url, max_connections=1, client_name=name)
    client = redis.asyncio.Redis.from_pool(pool)
    try:
        held = asyncio.ensure_future(asend_all(client, [("BLPOP", f"{name}:none", 60)]))
        with redis.Redis.from_url(redis_url) as watcher:
            while not _blocked(watcher, name):  # the server holds the command
                await asyncio.sleep(0)  # lets the batch go on; no time is waited for
        held.cancel()
        # redis-py's read may turn the cancellation into its own TimeoutError (its timeout
        # context sees the cancel): either way the batch ends, its reply unread
        with pytest.raises((asyncio.CancelledError, redis.TimeoutError)):
            await held
        assert await asend_all(client, [("ECHO", "mine")]) == [b"mine"]
    finally:
        await client.aclose()


def _blocked(watcher: redis.Redis, name: str) -> bool:
    return any(
        each.get("name") == name and each.get("cmd") == "blpop" for each in watcher.client_list()
    )


@pytest.mark.parametrize("single", [False, True], ids=["pooled", "single-connection"])
def test_a_single_connection_client_gets_the_same_replies(redis_url: str, single: bool) -> None:
    with redis.Redis.from_url(redis_url, single_connection_client=single) as client:
        replies = send_all(client, [("ECHO", "a"), ("EVALSHA", MISSING, 0), ("ECHO", "b")])
        assert replies[0] == b"a" and isinstance(replies[1], NoScriptError)
        assert replies[2] == b"b"


async def test_an_async_single_connection_client_gets_the_same_replies(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url, single_connection_client=True)
    try:
        replies = await asend_all(client, [("ECHO", "a"), ("EVALSHA", MISSING, 0)])
        assert replies[0] == b"a" and isinstance(replies[1], NoScriptError)
        assert await client.echo("after") == b"after"  # its one connection is usable still
    finally:
        await client.aclose()


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_a_batch_after_script_flush_reloads_its_scripts(
    own_redis: OwnRedis, face: str
) -> None:
    """Both script calls of a batch answered NOSCRIPT (a flushed or restarted server) are
    run again with EVAL: the batch still answers both."""
    store = RedisStore.from_url(own_redis.url, open_keys=False)
    admit = Admit("k", 1.0, 1.0, VELOCITY, BUCKET)
    check = CheckLoops("k", MARK, LOOPS)
    try:
        for sends in (1, 2):
            with redis.Redis.from_url(own_redis.url) as raw:
                raw.script_flush()
            if face == "sync":
                decision, verdict = store.run_many([admit, check])
            else:
                decision, verdict = await store.arun_many([admit, check])
            assert decision.bucket is not None and decision.bucket.allowed
            assert verdict.allowed and verdict.count == sends
    finally:
        store.close()
        await store.aclose()
