"""The token bucket (docs/design.md, "Token bucket"), through Fuse.admit on a simulated clock."""

from __future__ import annotations

import math

import pytest

from tests.conftest import Clock
from tokenfuse import FREE, GROWTH, STARTER, BucketPolicy, Fuse, MemoryStore, QuotaExhausted
from tokenfuse._core import bucket as core
from tokenfuse.events import FuseEvent


def make_fuse(clock: Clock, policy: BucketPolicy, events: list[FuseEvent] | None = None) -> Fuse:
    hooks = [events.append] if events is not None else None
    store = MemoryStore(clock=clock)
    return Fuse(store, name="inbound", velocity=None, bucket=policy, on_event=hooks)


@pytest.mark.parametrize(
    ("tier", "rate", "capacity"),
    [
        pytest.param(FREE, 10, 50, id="free"),
        pytest.param(STARTER, 50, 200, id="starter"),
        pytest.param(GROWTH, 100, 500, id="growth"),
    ],
)
def test_tier_presets(tier: BucketPolicy, rate: float, capacity: float) -> None:
    assert (tier.rate, tier.capacity) == (rate, capacity)


def test_burst_up_to_capacity_then_refuse_with_retry_after(clock: Clock) -> None:
    fuse = make_fuse(clock, BucketPolicy(rate=10, capacity=50))
    admitted = [fuse.admit("org-1").allowed for _ in range(60)]
    assert admitted == [True] * 50 + [False] * 10
    refusal = fuse.admit("org-1")
    assert isinstance(refusal.error, QuotaExhausted)
    assert refusal.error.retry_after == pytest.approx(0.1)
    assert refusal.error.limit == 50
    clock.advance(refusal.error.retry_after)
    assert fuse.admit("org-1").allowed
    assert not fuse.admit("org-1").allowed


def test_long_run_rate_is_capped_by_refill(clock: Clock) -> None:
    fuse = make_fuse(clock, BucketPolicy(rate="600/minute", capacity=20))
    admitted = 0
    for _ in range(10_000):  # 100 attempts/s for 100 s
        admitted += fuse.admit("org-1").allowed
        clock.advance(0.01)
    assert admitted == pytest.approx(20 + 10 * 100, abs=1)


def test_cost_takes_more_than_one(clock: Clock) -> None:
    fuse = make_fuse(clock, BucketPolicy(rate=1, capacity=10))
    assert fuse.admit("org-1", cost=7).allowed
    refusal = fuse.admit("org-1", cost=7)
    assert not refusal.allowed
    assert refusal.bucket is not None
    assert refusal.bucket.remaining == pytest.approx(3)
    assert refusal.bucket.retry_after == pytest.approx(4)


def test_callers_have_their_own_buckets(clock: Clock) -> None:
    fuse = make_fuse(clock, BucketPolicy(rate=1, capacity=1))
    assert fuse.admit("org-1").allowed
    assert not fuse.admit("org-1").allowed
    assert fuse.admit("org-2").allowed


def test_live_override_changes_one_caller_without_restart(clock: Clock) -> None:
    store = MemoryStore(clock=clock)
    policy = BucketPolicy(rate=1, capacity=2)
    worker_a = Fuse(store, name="inbound", velocity=None, bucket=policy)
    worker_b = Fuse(store, name="inbound", velocity=None, bucket=policy)
    worker_a.set_bucket("org-1", capacity=5, rate="10/second")
    assert [worker_b.admit("org-1").allowed for _ in range(6)] == [True] * 5 + [False]
    assert [worker_b.admit("org-2").allowed for _ in range(3)] == [True, True, False]
    worker_a.set_bucket("org-1", capacity=None, rate=None)
    clock.advance(100)
    assert [worker_b.admit("org-1").allowed for _ in range(3)] == [True, True, False]


def test_reset_refills(clock: Clock) -> None:
    fuse = make_fuse(clock, BucketPolicy(rate=1, capacity=3))
    for _ in range(3):
        fuse.admit("org-1")
    fuse.reset("org-1")
    assert fuse.admit("org-1").allowed


def run_at(fuse: Fuse, clock: Clock, per_second: float, seconds: float) -> None:
    end = clock.now + seconds
    while clock.now < end:
        fuse.admit("org-1")
        clock.advance(1 / per_second)


def test_near_limit_alert_fires_once_per_episode(clock: Clock) -> None:
    events: list[FuseEvent] = []
    fuse = make_fuse(clock, BucketPolicy(rate=10, capacity=50), events)
    clock.advance(60 - clock.now % 60)  # start on a minute boundary: easier to read
    run_at(fuse, clock, 9, 290)  # 90 % of quota, but not yet for 5 minutes
    assert [e.kind for e in events] == []
    run_at(fuse, clock, 9, 120)
    assert [e.kind for e in events] == ["near_limit"]
    assert events[0].key == "org-1"
    run_at(fuse, clock, 9, 600)  # the same episode goes on: no second alert
    assert len(events) == 1
    run_at(fuse, clock, 2, 120)  # drops below 80 %: the episode ends, the alert re-arms
    run_at(fuse, clock, 9.5, 420)
    assert [e.kind for e in events] == ["near_limit", "near_limit"]


def test_usage_below_the_threshold_never_alerts(clock: Clock) -> None:
    events: list[FuseEvent] = []
    fuse = make_fuse(clock, BucketPolicy(rate=10, capacity=50), events)
    run_at(fuse, clock, 7.5, 3_600)
    assert events == []


def test_an_idle_minute_ends_the_episode() -> None:
    state = core.new_state(0.0, FREE)
    fired_in = []  # the minutes whose calls fired the alert
    now = 0.0
    for minute in range(12):
        if minute == 4:
            now += 60  # idle minute
            continue
        for _ in range(540):  # 90 % of FREE's 600 calls a minute: every active minute is hot
            if core.consume(state, 1, now, FREE).near_limit:
                fired_in.append(math.floor(now / 60))
            now += 60 / 540
    # Minutes 0-3 are too short a run; had the idle minute not ended it, minute 5 would fire.
    # The run that starts at minute 5 has lasted five minutes once minute 10 is hot too.
    assert fired_in == [10]


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"rate": 0, "capacity": 1}, id="zero-rate"),
        pytest.param({"rate": 1, "capacity": 0}, id="zero-capacity"),
        pytest.param({"rate": "lots", "capacity": 1}, id="bad-rate-string"),
        pytest.param({"rate": 1, "capacity": float("nan")}, id="nan-capacity"),
        pytest.param({"rate": 1, "capacity": 1, "near_limit_fraction": 1.5}, id="fraction"),
    ],
)
def test_bad_bucket_config_is_a_clear_error(kwargs: dict[str, object]) -> None:
    from tokenfuse import ConfigurationError

    with pytest.raises(ConfigurationError):
        BucketPolicy(**kwargs)  # type: ignore[arg-type]
