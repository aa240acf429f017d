"""What the admin page asks (``Panel``, on ``tokenfuse.admin.Admin``): the key table, one key
in detail, the key a page names, and live changes.

Run on the embedded store with a simulated clock and on the real Redis (and Cluster).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator

import pytest
import redis.cluster

from tests.admin.conftest import POLICY
from tests.conftest import Clock
from tokenfuse import Fuse, MemoryStore
from tokenfuse._dashboard.history import MinuteHistory
from tokenfuse._dashboard.service import Panel
from tokenfuse._errors import ConfigurationError
from tokenfuse._identity import Identity
from tokenfuse._secret import process_secret
from tokenfuse._stores.redis import RedisStore
from tokenfuse.admin import AmbiguousKey, KeyNotFound, NotAvailable


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def fuse(request: pytest.FixtureRequest) -> Fuse:
    name = "memory_fuse" if request.param == "memory" else "redis_fuse"
    fuse: Fuse = request.getfixturevalue(name)
    return fuse


def spend(fuse: Fuse, amounts: dict[str, float]) -> None:
    for name, amount in amounts.items():
        fuse.record(name, amount)


def key_id(name: str) -> str:
    return Identity.named(name).key_id


AGENTS = {"agent-a": 100, "agent-b": 500, "agent-c": 300, "agent-loop": 1_200}


def test_the_table_shows_open_keys_first_then_the_busiest(fuse: Fuse) -> None:
    spend(fuse, AGENTS)
    listing = Panel(fuse).keys(sort="rate")

    assert [view.key_id for view in listing.keys] == [
        key_id(name) for name in ("agent-loop", "agent-b", "agent-c", "agent-a")
    ]
    loop, busiest = listing.keys[0], listing.keys[1]
    assert (loop.state, loop.label, loop.status.limit, loop.status.rate) == (
        "open", "agent-loop", 1_000, 1_200,
    )  # fmt: skip
    # The store holds hashes only: a label is known once an event taught it (the trip).
    assert (busiest.state, busiest.label, busiest.status.rate) == ("ok", None, 500)
    assert listing.total == 4
    # Open first whatever the order asked for: by baseline (none yet), the rest stay as listed.
    assert Panel(fuse).keys(sort="baseline").keys[0].key_id == key_id("agent-loop")


def test_filters_search_and_pages(fuse: Fuse) -> None:
    spend(fuse, AGENTS)
    panel = Panel(fuse)

    def ids(**options: object) -> list[str]:
        return [view.key_id for view in panel.keys(**options).keys]  # type: ignore[arg-type]

    assert ids(state="open") == [key_id("agent-loop")]
    assert len(ids(state="ok")) == 3
    assert ids(search="LOOP") == [key_id("agent-loop")]  # a label, in any case
    assert ids(search=key_id("agent-c")[:6]) == [key_id("agent-c")]  # the start of an id
    assert ids(sort="rate", limit=2, offset=1) == [key_id("agent-b"), key_id("agent-c")]
    with pytest.raises(ConfigurationError, match="sort must be one of"):
        panel.keys(sort="cost")
    with pytest.raises(ConfigurationError, match="state must be"):
        panel.keys(state="tripped")  # type: ignore[arg-type]


def test_a_key_in_detail(memory_fuse: Fuse, clock: Clock) -> None:
    memory_fuse.record("agent-7", 300)
    clock.advance(10)
    memory_fuse.record("agent-7", 900)  # 1,200 in the window: trips
    clock.advance(5)

    detail = Panel(memory_fuse).detail(key_id("agent-7"))

    assert (detail.key.label, detail.key.state, detail.key.status.rate) == (
        "agent-7", "open", 1_200,
    )  # fmt: skip
    assert (detail.trip_reason, detail.last_trip, detail.strikes) == (
        "manual_ceiling", clock.now - 5, 1,
    )  # fmt: skip
    amounts = [slot.amount for slot in detail.window]
    assert len(amounts) == 13 and amounts[-1] == 0  # the current slot: nothing yet
    assert amounts[-2] == 900 and amounts[-4] == 300  # 5 s and 15 s ago
    assert sum(amounts) == 1_200
    assert detail.window[-1].start <= clock.now < detail.window[-1].start + 5
    assert [event.kind for event in detail.events] == ["tripped"]
    assert detail.minutes and detail.minutes[-1][1] == 1_200  # this look, this minute


def test_the_detail_of_an_unknown_key_is_not_found(fuse: Fuse) -> None:
    with pytest.raises(KeyNotFound):
        Panel(fuse).detail("agent-never-seen")


# -- the key a page names ------------------------------------------------------------------------


def names_sharing_an_id_start(length: int = 4) -> tuple[str, str]:
    """Two names whose key ids start alike (found by trying, the same ones every run)."""
    seen: dict[str, str] = {}
    for n in itertools.count():
        name = f"agent-{n}"
        start = key_id(name)[:length]
        if start in seen:
            return seen[start], name
        seen[start] = name
    raise AssertionError("unreachable")


def test_a_key_is_named_by_its_id_its_start_or_its_name(fuse: Fuse) -> None:
    spend(fuse, {"agent-1": 10, "agent-2": 10})
    panel = Panel(fuse)
    wanted = key_id("agent-1")
    assert panel.detail(wanted).key.key_id == wanted
    assert panel.detail(wanted[:5]).key.key_id == wanted
    assert panel.detail(wanted, by="id").key.key_id == wanted
    assert panel.detail("agent-1").key.key_id == wanted
    assert panel.detail("agent-1", by="name").key.key_id == wanted


def test_an_id_start_shared_by_two_keys_is_refused(fuse: Fuse) -> None:
    first, second = names_sharing_an_id_start()
    spend(fuse, {first: 10, second: 10})
    with pytest.raises(AmbiguousKey, match="give more of it"):
        Panel(fuse).detail(key_id(first)[:4])


def test_a_string_both_an_id_and_a_name_is_refused_until_told_which(fuse: Fuse) -> None:
    start = key_id("agent-1")[:6]  # hex: also a name, once it has state
    spend(fuse, {"agent-1": 10, start: 10})
    panel = Panel(fuse)
    with pytest.raises(AmbiguousKey, match="both a key id and a name"):
        panel.detail(start)
    assert panel.detail(start, by="id").key.key_id == key_id("agent-1")
    assert panel.detail(start, by="name").key.key_id == key_id(start)


def test_a_credential_is_never_taken_for_a_name(fuse: Fuse) -> None:
    with pytest.raises(AmbiguousKey, match="looks like a credential"):
        Panel(fuse).reset("sk-proj-0123456789abcdef0123")


# -- live changes --------------------------------------------------------------------------------


def test_reset_and_limits_by_key_id(fuse: Fuse) -> None:
    spend(fuse, {"agent-loop": 1_200})
    panel = Panel(fuse)
    loop = key_id("agent-loop")

    assert panel.reset(loop).state != "open"
    assert fuse.gate("agent-loop").allowed
    panel.set_limit(loop, "50k/min")
    assert fuse.status("agent-loop").limit == 50_000
    panel.set_bucket(loop, rate="600/min", capacity=20)
    status = fuse.status("agent-loop")
    assert (status.bucket_rate, status.bucket_capacity) == (10.0, 20.0)
    panel.set_limit(loop, None)
    assert fuse.status("agent-loop").limit == POLICY.limit

    kinds = [(event.kind, event.label) for event in panel.recent_events(10)]
    assert kinds == [
        ("tripped", "agent-loop"),
        ("reset", "agent-loop"),
        ("configured", "agent-loop"),
        ("configured", "agent-loop"),
        ("configured", "agent-loop"),
    ]
    with pytest.raises(ConfigurationError):
        panel.set_limit(loop, "fast")


def test_forgive_needs_detection_v2(fuse: Fuse) -> None:
    if hasattr(Fuse, "forgive"):
        pytest.skip("this tokenfuse has Fuse.forgive: the admin app calls it")
    spend(fuse, {"agent-loop": 1_200})
    with pytest.raises(NotAvailable, match="reset"):
        Panel(fuse).forgive(key_id("agent-loop"))


@pytest.mark.redis
def test_another_process_sees_the_trip_the_label_and_the_reset(
    redis_fuse: Fuse, other_process: Fuse
) -> None:
    redis_fuse.record(Identity.secret("sk-proj-00000000000000009c21"), 5_000)
    [view] = Panel(other_process).keys().keys
    assert (view.state, view.label) == ("open", "sk-…9c21")

    Panel(other_process).reset(view.key_id)

    assert Panel(redis_fuse).keys().keys[0].state != "open"
    detail = Panel(redis_fuse).detail(view.key_id)
    assert [event.kind for event in detail.events] == ["tripped", "reset"]
    assert detail.key.label == "sk-…9c21"


@pytest.mark.redis
def test_a_label_outlasts_the_recent_events(redis_fuse: Fuse, other_process: Fuse) -> None:
    """Labels are kept with the store's TTL, not only in the stream's latest events."""
    redis_fuse.store.events.maxlen = 1  # type: ignore[attr-defined]
    redis_fuse.set_limit("agent-early", "5k/min")  # teaches the label
    for n in range(300):
        redis_fuse.reset(f"agent-{n}")  # the stream forgets the early event
    early = Panel(other_process).detail(key_id("agent-early"))
    assert early.key.label == "agent-early"


# -- the per-minute history ----------------------------------------------------------------------


def test_history_keeps_the_last_sample_of_each_minute_for_an_hour() -> None:
    history = MinuteHistory(max_keys=2)
    start = 1_767_225_600.0  # a whole minute
    history.observe([("k", 10.0)], start)
    history.observe([("k", 30.0)], start + 59)  # the same minute: the later sample stands
    history.observe([("k", 20.0)], start + 60)
    assert history.minutes("k", start + 61) == [(29_453_760, 30.0), (29_453_761, 20.0)]
    assert history.minutes("k", start + 60 * 60) == [(29_453_761, 20.0)]  # an hour on
    history.observe([("a", 1.0), ("b", 1.0)], start)
    assert history.minutes("k", start) == []  # the least recently seen of three went
    assert history.since == start


# -- a real cluster ------------------------------------------------------------------------------


@pytest.fixture
def cluster_fuse(cluster_url: str) -> Iterator[tuple[Fuse, str]]:
    prefix = f"tf-adm-{uuid.uuid4().hex[:8]}"
    store = RedisStore.from_url(cluster_url, prefix=prefix, cluster=True)
    yield Fuse(store, velocity=POLICY), prefix
    store.close()
    raw = redis.cluster.RedisCluster.from_url(cluster_url)
    for key in raw.scan_iter(match=f"{prefix}:*"):
        raw.delete(key)
    raw.close()


@pytest.mark.cluster
def test_a_cluster_lists_and_finds_the_keys_of_every_primary(
    cluster_fuse: tuple[Fuse, str], cluster_url: str
) -> None:
    fuse, prefix = cluster_fuse
    names = [f"agent-{n}" for n in range(30)]
    spend(fuse, dict.fromkeys(names, 10.0))
    fuse.record("agent-loop", 5_000)
    raw = redis.cluster.RedisCluster.from_url(cluster_url)
    hashes = [Identity.named(n).keyed(process_secret()).hex for n in names]
    owners = {raw.get_node_from_key(f"{prefix}:{{default:{hashed}}}").name for hashed in hashes}
    assert owners == {node.name for node in raw.get_primaries()}  # spread over every primary
    raw.close()

    panel = Panel(fuse)
    listed = panel.keys(limit=100)
    assert sorted(view.key_id for view in listed.keys) == sorted(
        key_id(n) for n in [*names, "agent-loop"]
    )
    assert (listed.keys[0].key_id, listed.keys[0].label) == (key_id("agent-loop"), "agent-loop")
    assert panel.detail(key_id("agent-17")).key.status.rate == 10.0


def test_a_fuse_on_a_store_without_a_log_gets_one() -> None:
    class Plain:
        """A store of the user's own: it runs operations and keeps no event log."""

        def __init__(self) -> None:
            self.inner = MemoryStore()

        def run(self, op: object) -> object:
            return self.inner.run(op)  # type: ignore[arg-type]

    fuse = Fuse(Plain(), velocity=POLICY)  # type: ignore[arg-type]
    panel = Panel(fuse)
    fuse.record("agent-loop", 5_000)
    assert [event.kind for event in panel.recent_events()] == ["tripped"]
