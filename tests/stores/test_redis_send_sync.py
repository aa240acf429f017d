"""The sync decisions' lean path on real redis-servers: an idle connection of
``RedisStore.from_url``'s pool taken and given back without redis-py's bookkeeping
(``SyncBlockingPool.take``/``give_back``) and the command written with ``sendall``
(``redis_send_sync``); redis-py's own checks, timeouts, errors and retry wherever they apply
(a due health check, a class with its own send, a server that stopped or resets mid-send, a
reply left unread, a forked process). Servers the tests stop or misconfigure are their own
(``own_redis``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.event import AfterConnectionReleasedEvent, EventListenerInterface
from redis.maint_notifications import MaintNotificationsConfig

from tests.stores.conftest import OwnRedis, unique_prefix
from tests.stores.test_redis_send import HUGE, LOOPS, POLICY, admit, stopped
from tokenfuse import Fuse, FuseEvent
from tokenfuse._errors import StoreUnavailable
from tokenfuse._health import StoreHealth
from tokenfuse._stores import redis_plain_pool, redis_ready
from tokenfuse._stores.ops import CheckLoops, Record, RecordBatch
from tokenfuse._stores.redis import RedisStore
from tokenfuse._stores.redis_budget import SyncBlockingPool
from tokenfuse._stores.redis_ready import nothing_to_read

pytestmark = pytest.mark.redis


@pytest.fixture
def store(redis_url: str) -> Iterator[RedisStore]:
    built = RedisStore.from_url(redis_url, prefix=unique_prefix(), open_keys=False)
    yield built
    built.close()


@pytest.fixture
def admin(own_redis: OwnRedis) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(own_redis.url) as client:
        yield client


def warm_pool(store: RedisStore) -> Any:
    """The sync pool of a store built by ``from_url``, after a first decision (connected, the
    server checked, the scripts known)."""
    store.run(admit())
    client: Any = store._clients.sync_client()
    pool = client.connection_pool
    assert type(pool) is SyncBlockingPool
    return pool


def counting_pool(pool: Any) -> dict[str, int]:
    """How often redis-py's own ``get_connection`` and ``release`` of ``pool`` run."""
    calls = {"get_connection": 0, "release": 0}
    for name in calls:
        method = getattr(pool, name)

        def counted(*args: Any, _method: Any = method, _name: str = name) -> Any:
            calls[_name] += 1
            return _method(*args)

        setattr(pool, name, counted)
    return calls


def used_connections(pool: Any) -> list[Any]:
    """Every connection the pool hands a decision from now on."""
    handed: list[Any] = []
    take = pool.take

    def recording() -> Any:
        connection = take()
        handed.append(connection)
        return connection

    pool.take = recording
    return handed


def counting_sends(connection: Any) -> list[Any]:
    """The commands redis-py's own ``send_packed_command`` of ``connection`` writes."""
    sent: list[Any] = []
    send = connection.send_packed_command

    def counted(command: Any, check_health: bool = True) -> None:
        sent.append(command)
        send(command, check_health)

    connection.send_packed_command = counted
    return sent


def pings(admin: redis.Redis) -> int:
    return int(admin.info("commandstats").get("cmdstat_ping", {}).get("calls", 0))


def idle(pool: Any) -> list[Any]:
    """The pool's idle connections (its queue holds None for each one not made yet)."""
    return [connection for connection in pool.pool.queue if connection is not None]


def test_decisions_take_and_give_back_idle_connections_the_lean_way(store: RedisStore) -> None:
    pool = warm_pool(store)
    calls = counting_pool(pool)
    fuse = Fuse(store, velocity=POLICY)
    connection = idle(pool)[0]
    sent = counting_sends(connection)
    for _ in range(5):
        store.run(admit())
        assert not fuse.record("agent", 10).degraded
        store.run_many([admit(), CheckLoops("a", "0123456789abcdef", LOOPS)])  # a batch
    assert calls == {"get_connection": 0, "release": 0}
    assert sent == []  # written with sendall, not redis-py's send
    assert idle(pool) == [connection]  # the one connection, back in the pool
    held = pool.take()  # the only idle connection is out: a new one, redis-py's way
    store.run(admit())
    assert calls == {"get_connection": 1, "release": 0}
    pool.give_back(held)
    assert len(idle(pool)) == 2


def test_a_connection_due_its_health_check_is_checked(
    own_redis: OwnRedis, admin: redis.Redis
) -> None:
    store = RedisStore.from_url(own_redis.url, prefix="send", open_keys=False)
    try:
        pool = warm_pool(store)
        handed = used_connections(pool)
        before = pings(admin)
        store.run(admit())
        assert pings(admin) == before  # not due: no PING
        handed[0].next_health_check = -1.0  # its interval passed: redis-py sends the check
        store.run(admit())
        assert pings(admin) - before == 1
    finally:
        store.close()


def test_a_connection_class_with_its_own_send_is_left_to_it(redis_url: str) -> None:
    sent: list[Any] = []

    class Sending(redis.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            sent.append(command)
            super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]

    store = RedisStore.from_url(
        redis_url, prefix=unique_prefix(), open_keys=False, connection_class=Sending
    )
    try:
        warm_pool(store)
        sent.clear()
        store.run(admit())
        assert len(sent) == 1
    finally:
        store.close()


def test_a_server_that_stops_reading_times_the_write_out(own_redis: OwnRedis) -> None:
    store = RedisStore.from_url(own_redis.url, prefix="send", open_keys=False)
    try:
        pool = warm_pool(store)
        handed = used_connections(pool)
        with stopped(own_redis), pytest.raises(StoreUnavailable) as caught:
            store.run(RecordBatch("big", (1.0,) * HUGE, POLICY))
        cause = caught.value.__cause__
        assert isinstance(cause, redis.TimeoutError)
        assert str(cause) == "Timeout writing to socket"  # the write's, not the reply's
        assert len(handed) == 1  # a timeout is not retried (redis_budget)
        assert not handed[0].is_connected  # nothing half-written goes back to the pool
        assert idle(pool) == handed  # given back all the same
        assert store.run(admit()).allowed  # reconnected
    finally:
        store.close()


def test_a_fuse_counts_a_decision_that_timed_out_and_fails_open(own_redis: OwnRedis) -> None:
    events: list[FuseEvent] = []
    store = RedisStore.from_url(own_redis.url, prefix="send", open_keys=False)
    fuse = Fuse(store, velocity=POLICY, on_event=events.append, health=StoreHealth(threshold=3))
    try:
        assert not fuse.record("agent", 10).degraded
        with stopped(own_redis):
            decision = fuse.record("agent", 10)
        assert decision.allowed and decision.degraded
        assert fuse.health.counts.failed == 1
        assert [event.kind for event in events] == ["store_unavailable"]
        assert "Timeout reading" in str(events[0])  # the write left; no reply came
        assert not fuse.record("agent", 10).degraded  # the server back: a real decision
    finally:
        store.close()


def test_a_server_that_resets_mid_send_is_retried_once(free_port: int, tmp_path: Any) -> None:
    # A bulk longer than the server takes is a protocol error: the server answers and closes
    # the connection while the client is still writing the rest of it.
    server = OwnRedis(free_port, tmp_path, "--proto-max-bulk-len", "1mb")
    server.start()
    store = RedisStore.from_url(server.url, prefix="send", open_keys=False)
    admin = redis.Redis.from_url(server.url)
    try:
        pool = warm_pool(store)
        handed = used_connections(pool)
        connections = admin.info("stats")["total_connections_received"]
        with pytest.raises(StoreUnavailable) as caught:
            store.run(RecordBatch("big", (1.0,) * HUGE, POLICY))
        cause = caught.value.__cause__
        assert isinstance(cause, redis.ConnectionError)
        assert "while writing to socket" in str(cause)
        # The connection's retry (one, at once) sent it again on a new connection.
        assert admin.info("stats")["total_connections_received"] - connections == 1
        assert len(handed) == 1 and not handed[0].is_connected
        assert store.run(admit()).allowed
    finally:
        store.close()
        admin.close()
        server.stop()


def test_a_connection_with_a_reply_unread_goes_through_redis_pys_check(redis_url: str) -> None:
    # (Maintenance notifications off: with them on, redis-py lets waiting data be, as a
    # notification the next read handles; so does ``take``.)
    store = RedisStore.from_url(
        redis_url,
        prefix=unique_prefix(),
        open_keys=False,
        maint_notifications_config=MaintNotificationsConfig(enabled=False),
    )
    try:
        pool = warm_pool(store)
        calls = counting_pool(pool)
        stale = pool.take()
        stale.send_command("ECHO", "stale")  # its reply is never read
        assert stale.can_read(timeout=1.0)  # it has arrived (read into the parser's buffer)
        socket_before = stale._sock
        pool.give_back(stale)
        assert idle(pool) == [stale]
        verdict = store.run(Record("k", 10, POLICY))  # the stale reply would be unreadable
        assert verdict.allowed
        assert stale._sock is not socket_before  # redis-py's check reconnected it
        assert calls == {"get_connection": 0, "release": 0}
    finally:
        store.close()


def test_a_connection_closed_by_the_server_is_reconnected_before_the_send(
    own_redis: OwnRedis, admin: redis.Redis
) -> None:
    store = RedisStore.from_url(own_redis.url, prefix="send", open_keys=False)
    try:
        pool = warm_pool(store)
        connection = idle(pool)[0]
        sent = counting_sends(connection)
        connections = admin.info("stats")["total_connections_received"]
        admin.client_kill_filter(_type="normal", skipme=True)  # the idle one, closed
        assert store.run(admit()).allowed
        assert admin.info("stats")["total_connections_received"] - connections == 1
        # reconnected by the check (its handshake redis-py's), then written the lean way
        assert sent and not [command for command in sent if b"FCALL" in b"".join(command)]
    finally:
        store.close()


def test_a_forked_process_takes_redis_pys_way(store: RedisStore) -> None:
    pool = warm_pool(store)
    calls = counting_pool(pool)
    pool.pid = -1  # made by another process: get_connection resets the pool first
    assert store.run(admit()).allowed
    assert calls == {"get_connection": 1, "release": 0}  # (reset: this process's pool now)
    assert store.run(admit()).allowed  # the lean way again
    assert calls == {"get_connection": 1, "release": 0}
    assert len(idle(pool)) == 1  # the new connection, in the new pool


def test_a_connection_asked_to_reconnect_is_given_back_redis_pys_way(store: RedisStore) -> None:
    pool = warm_pool(store)
    calls = counting_pool(pool)
    connection = pool.take()
    connection.mark_for_reconnect()  # a node moving, say
    pool.give_back(connection)
    assert calls == {"get_connection": 0, "release": 1}
    assert not connection.is_connected  # release disconnected it
    assert store.run(admit()).allowed


def test_a_take_stopped_during_its_check_gives_the_connection_back(
    store: RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = warm_pool(store)
    connection = idle(pool)[0]

    def interrupted(connection: Any) -> bool:
        raise KeyboardInterrupt  # the decision stopped during the check

    monkeypatch.setattr(redis_ready, "nothing_to_read", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pool.take()
    assert idle(pool) == [connection]  # not lost to the pool
    monkeypatch.undo()
    assert store.run(admit()).allowed


def test_a_connection_with_nothing_to_read_is_not_asked_again(store: RedisStore) -> None:
    pool = warm_pool(store)
    connection = idle(pool)[0]
    asked: list[float] = []
    can_read = connection.can_read

    def counted(timeout: float = 0) -> bool:
        asked.append(timeout)
        return bool(can_read(timeout))

    connection.can_read = counted
    assert store.run(admit()).allowed
    assert asked == []  # one poll said so: no recv between two settimeout calls
    connection.send_command("ECHO", "stale")  # a reply waits: redis-py's can_read decides
    assert connection.can_read(timeout=1.0)
    asked.clear()
    assert nothing_to_read(connection) is False
    taken = pool.take()
    # redis-py's can_read was asked (with maintenance notifications on, its default "auto",
    # redis-py then lets the data be, as a notification the next read handles; so does take)
    assert taken is connection and asked
    taken.disconnect()  # (the stale reply dropped)
    pool.give_back(taken)
    assert store.run(admit()).allowed


# -- a caller's plain pool (redis.ConnectionPool): the same lean way (redis_plain_pool) -----------


@pytest.fixture
def plain(redis_url: str) -> Iterator[tuple[RedisStore, Any]]:
    client = redis.Redis.from_url(redis_url)
    store = RedisStore(client, prefix=unique_prefix(), open_keys=False)
    store.run(admit())  # connected, the server checked, the scripts known
    assert type(client.connection_pool) is redis.ConnectionPool
    yield store, client.connection_pool
    client.close()


def test_a_plain_pool_hands_out_idle_connections_the_lean_way(
    plain: tuple[RedisStore, Any],
) -> None:
    store, pool = plain
    calls = counting_pool(pool)
    for _ in range(5):
        assert store.run(Record("k", 10, POLICY)).allowed
        store.run_many([admit(), CheckLoops("a", "0123456789abcdef", LOOPS)])
    assert calls == {"get_connection": 0, "release": 0}
    assert len(pool._available_connections) == 1 and not pool._in_use_connections
    held = redis_plain_pool.take(pool)  # the only idle one is out: a new one, redis-py's way
    store.run(admit())
    assert calls == {"get_connection": 1, "release": 0}
    redis_plain_pool.give_back(pool, held)
    assert len(pool._available_connections) == 2 and not pool._in_use_connections


def test_a_plain_pool_connection_with_a_new_token_is_released_redis_pys_way(
    plain: tuple[RedisStore, Any],
) -> None:
    store, pool = plain
    calls = counting_pool(pool)
    connection = redis_plain_pool.take(pool)
    connection._re_auth_token = object()  # a streaming credential provider's new token
    reauthed: list[Any] = []
    connection.re_auth = lambda: reauthed.append(connection)  # redis-py's would send AUTH
    redis_plain_pool.give_back(pool, connection)
    assert calls == {"get_connection": 0, "release": 1}
    assert reauthed == [connection]  # release's event reached its listener
    del connection.re_auth
    connection._re_auth_token = None
    assert store.run(admit()).allowed


def test_a_plain_pool_with_another_released_listener_is_released_redis_pys_way(
    plain: tuple[RedisStore, Any],
) -> None:
    store, pool = plain
    heard: list[Any] = []

    class Listening(EventListenerInterface):
        def listen(self, event: object) -> None:
            heard.append(event)

    pool._event_dispatcher.register_listeners({AfterConnectionReleasedEvent: [Listening()]})
    calls = counting_pool(pool)
    assert store.run(admit()).allowed
    assert calls == {"get_connection": 1, "release": 1} and len(heard) == 1


def test_a_released_event_whose_one_listener_is_another_takes_redis_pys_way(
    plain: tuple[RedisStore, Any],
) -> None:
    """The released event's listeners replaced by one that is not redis-py's re-auth: each
    connection is released redis-py's way, so that it hears every release."""
    store, pool = plain
    heard: list[Any] = []

    class Listening(EventListenerInterface):
        def listen(self, event: object) -> None:
            heard.append(event)

    pool._event_dispatcher._event_listeners_mapping[AfterConnectionReleasedEvent] = [Listening()]
    calls = counting_pool(pool)
    assert store.run(admit()).allowed
    assert calls == {"get_connection": 1, "release": 1} and len(heard) == 1


def test_a_plain_pool_of_another_process_takes_redis_pys_way(
    plain: tuple[RedisStore, Any],
) -> None:
    store, pool = plain
    calls = counting_pool(pool)
    pool.pid = -1  # made by another process: get_connection resets the pool first
    assert store.run(admit()).allowed
    assert calls == {"get_connection": 1, "release": 0}  # (reset: this process's pool now)
    assert len(pool._available_connections) == 1 and not pool._in_use_connections


def test_a_plain_pool_take_stopped_during_its_check_gives_the_connection_back(
    plain: tuple[RedisStore, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, pool = plain

    def interrupted(connection: Any) -> bool:
        raise KeyboardInterrupt  # the decision stopped during the check

    monkeypatch.setattr(redis_ready, "nothing_to_read", interrupted)
    with pytest.raises(KeyboardInterrupt):
        redis_plain_pool.take(pool)
    assert len(pool._available_connections) == 1 and not pool._in_use_connections
    monkeypatch.undo()
    assert store.run(admit()).allowed
