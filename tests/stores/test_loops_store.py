"""The failure-loop string on a real Redis: its size, its lifetime, and strangers' keys."""

from __future__ import annotations

import pytest
import redis

from tests.conftest import Clock
from tokenfuse._core.loops import LoopPolicy
from tokenfuse._errors import StoreUnavailable
from tokenfuse._stores.ops import CheckLoops, ForgetLoops, NoteLoop
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_codec import LOOP_CALL, loop_state, loops_key_of

pytestmark = pytest.mark.redis

KEY = "default:" + "ab" * 16


@pytest.fixture
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def test_the_string_holds_at_most_max_calls_and_lives_an_hour_past_its_last_call(
    client: redis.Redis, redis_prefix: str, clock: Clock
) -> None:
    store = RedisStore(client, prefix=redis_prefix, clock=clock, open_keys=False)
    policy = LoopPolicy(max_calls=16)
    for n in range(100):  # a caller inventing calls: the table stays 16 long
        store.run(CheckLoops(KEY, f"{n:016x}", policy))
    name = loops_key_of(redis_prefix, KEY)
    raw = client.get(name)
    assert raw is not None and len(raw) == 16 * LOOP_CALL.size == 16 * 120
    ttl = client.pttl(name)
    assert 3_600_000 < ttl <= 3_600_000 + 120_000  # not the identity's 14 days
    day = LoopPolicy(failures=2, cooldown=86_400, cooldown_max=86_400)
    store.run(NoteLoop(KEY, f"{99:016x}", day, True, 500))
    store.run(NoteLoop(KEY, f"{99:016x}", day, True, 500))
    assert client.pttl(name) > 86_400_000  # a refusal in force outlives its cooldown
    clock.advance(3 * 86_400)
    assert store.run(ForgetLoops(KEY)) == 16
    assert client.get(name) is None
    assert loop_state(None).calls == []


def test_a_key_that_is_not_tokenfuse_loop_state_is_an_error_not_a_guess(
    client: redis.Redis, redis_prefix: str, clock: Clock
) -> None:
    store = RedisStore(client, prefix=redis_prefix, clock=clock, open_keys=False)
    client.set(loops_key_of(redis_prefix, KEY), b"something else")
    with pytest.raises(StoreUnavailable):
        store.run(CheckLoops(KEY, "0" * 16, LoopPolicy()))


def test_fingerprints_are_checked_before_they_reach_redis(
    client: redis.Redis, redis_prefix: str
) -> None:
    store = RedisStore(client, prefix=redis_prefix, open_keys=False)
    with pytest.raises(ValueError, match="16 hex"):
        store.run(CheckLoops(KEY, "not hex at all!!", LoopPolicy()))


def test_threads_failing_the_same_call_at_once_trip_it_exactly_once(
    redis_url: str, redis_prefix: str
) -> None:
    """Sixteen agents' failures of one call land together on the server's clock: each note is
    one script, so the count is exact and one of them, only one, trips the call."""
    from tests.stores.conftest import all_at_once

    store = RedisStore.from_url(redis_url, prefix=redis_prefix, open_keys=False)
    policy = LoopPolicy(failures=5)
    mark = "feedfacecafebeef"
    try:
        verdicts = all_at_once(
            lambda: store.run(NoteLoop(KEY, mark, policy, True, 500, "server_error")), 16
        )
        assert sum(verdict.tripped for verdict in verdicts) == 1
        assert sorted(verdict.count for verdict in verdicts)[:5] == [1, 2, 3, 4, 5]
        checks = all_at_once(lambda: store.run(CheckLoops(KEY, mark, policy)), 8)
        assert not any(check.allowed for check in checks)
        assert all(check.reason == "failure_loop" for check in checks)
    finally:
        store.close()
