"""The velocity check (docs/design.md, "Decision order"), through Fuse on a simulated clock.

The learning rules at the end drive the core's state directly, where each learned minute
can be counted.
"""

from __future__ import annotations

import pytest

from tests.conftest import Clock
from tokenfuse import (
    CeilingExceeded,
    Fuse,
    FuseTripped,
    LoopSuspected,
    MemoryStore,
    VelocityPolicy,
)
from tokenfuse._core import velocity as core

DAY = 86_400.0
KEY = "agent-7"


def make_fuse(clock: Clock, **policy: object) -> Fuse:
    return Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(**policy))  # type: ignore[arg-type]


def steady(fuse: Fuse, clock: Clock, *, per_minute: float, seconds: float, every: float = 20.0,
           key: str = KEY) -> int:  # fmt: skip
    """Spend ``per_minute`` as evenly spaced calls for ``seconds``; return how many tripped."""
    trips = 0
    amount = per_minute * every / 60.0
    end = clock.now + seconds
    while clock.now < end:
        trips += fuse.record(key, amount).tripped
        clock.advance(every)
    return trips


def loop_until_refused(
    fuse: Fuse, clock: Clock, *, per_minute: float, every: float = 2.0, limit: float = 600.0
) -> tuple[float, FuseTripped]:
    """Run a retry loop the way the transport does (gate, then record) until the gate refuses.

    Returns (seconds from the loop's start to the trip, the refusal the next call gets)."""
    start = clock.now
    tripped_at = None
    while clock.now - start < limit:
        gate = fuse.gate(KEY)
        if not gate.allowed:
            assert gate.error is not None
            assert tripped_at is not None
            return tripped_at - start, gate.error
        if fuse.record(KEY, per_minute * every / 60.0).tripped:
            tripped_at = clock.now
        clock.advance(every)
    raise AssertionError(f"a {per_minute}/min loop ran {limit} s without being refused")


@pytest.fixture
def established(clock: Clock) -> Fuse:
    """A key with a steady 300 tokens/min for 3.5 days: a background automation."""
    fuse = make_fuse(clock, cold_start_limit=2_000)
    assert steady(fuse, clock, per_minute=300, seconds=3.5 * DAY) == 0
    status = fuse.status(KEY)
    assert status.established
    assert status.baseline == pytest.approx(300, rel=0.01)
    return fuse


def test_loop_on_established_key_trips_as_loop_suspected_within_a_minute(
    established: Fuse, clock: Clock
) -> None:
    seconds, error = loop_until_refused(established, clock, per_minute=3_150)
    assert seconds <= 60
    assert isinstance(error, LoopSuspected)
    assert error.rate == pytest.approx(3_150, rel=0.05)
    assert error.baseline == pytest.approx(300, rel=0.01)
    assert error.multiple == pytest.approx(10.5, rel=0.05)
    assert error.reason == "loop_suspected"
    assert str(error).startswith("possible agent loop or retry storm: 3,1")
    key = f"{KEY} [id {established.key_id(KEY)}]"
    assert f"the baseline of 300 tokens/min for key {key} (blocked for" in str(error)


def test_same_loop_on_a_new_key_hits_the_cold_start_ceiling(clock: Clock) -> None:
    fuse = make_fuse(clock, cold_start_limit=2_000)
    # ten minutes: none learned yet (after cold_start_samples, the ceiling follows the key)
    steady(fuse, clock, per_minute=300, seconds=600)
    assert fuse.status(KEY).samples == 0
    seconds, error = loop_until_refused(fuse, clock, per_minute=3_150)
    assert seconds <= 60
    assert isinstance(error, CeilingExceeded)
    assert error.reason == "cold_start_ceiling"
    assert error.limit == 2_000
    assert error.baseline is None
    assert error.multiple is None


def test_manual_ceiling_is_checked_first(established: Fuse, clock: Clock) -> None:
    established.set_limit(KEY, "1000/minute")
    seconds, error = loop_until_refused(established, clock, per_minute=3_150)
    assert isinstance(error, CeilingExceeded)
    assert error.reason == "manual_ceiling"
    assert error.limit == 1_000
    assert error.baseline == pytest.approx(300, rel=0.01)  # known, but not what tripped
    assert seconds < 30  # the ceiling is lower than the spike threshold, so it trips sooner


def test_manual_ceiling_needs_no_history(clock: Clock) -> None:
    fuse = make_fuse(clock, limit="500/minute", cold_start_limit=None)
    assert fuse.record(KEY, 500).allowed
    decision = fuse.record(KEY, 1)
    assert decision.tripped
    assert isinstance(decision.error, CeilingExceeded)


def test_key_below_min_baseline_is_not_spike_checked(clock: Clock) -> None:
    fuse = make_fuse(clock, min_baseline=100, cold_start_limit=5_000)
    assert steady(fuse, clock, per_minute=50, seconds=3.5 * DAY) == 0
    assert fuse.status(KEY).established
    # 20x its baseline, far over the spike multiple, but under the cold-start ceiling that
    # still guards keys whose baseline is too small to mean anything.
    assert steady(fuse, clock, per_minute=1_000, seconds=300, every=2) == 0
    _, error = loop_until_refused(fuse, clock, per_minute=6_000)
    assert error.reason == "cold_start_ceiling"


def test_one_large_call_is_not_a_loop_but_many_at_that_rate_are(
    established: Fuse, clock: Clock
) -> None:
    decision = established.record(KEY, 25 * 300)  # one long-document request
    assert decision.allowed
    assert decision.rate >= 10 * 300  # the spike is there; only the single-call guard holds it
    clock.advance(60)
    seconds, error = loop_until_refused(established, clock, per_minute=25 * 300, every=6)
    assert isinstance(error, LoopSuspected)
    assert seconds <= 30  # five calls: the spike must hold without the largest one


def test_a_loop_does_not_raise_the_baseline(established: Fuse, clock: Clock) -> None:
    before = established.status(KEY).learned_baseline
    for _ in range(5):  # five loops, each waiting out its (escalating) cooldown
        loop_until_refused(established, clock, per_minute=5_000)
        clock.advance(established.status(KEY).open_until - clock.now)  # type: ignore[operator]
    steady(established, clock, per_minute=300, seconds=600)
    # Every clean minute spent exactly 300, so only a learned loop minute could move it at all.
    assert established.status(KEY).learned_baseline == pytest.approx(before, rel=1e-12)


def test_cooldown_blocks_then_escalates_then_resets_after_an_hour(
    established: Fuse, clock: Clock
) -> None:
    cooldowns = []
    for _ in range(3):
        loop_until_refused(established, clock, per_minute=5_000)
        open_until = established.status(KEY).open_until
        assert open_until is not None
        tripped_at = clock.now - 2  # the refusing gate comes one loop step after the trip
        cooldowns.append(round(open_until - tripped_at))
        clock.advance(open_until - clock.now - 1)
        assert not established.gate(KEY).allowed  # still open one second before the end
        clock.advance(1)
        assert established.gate(KEY).allowed
    assert cooldowns == [60, 120, 240]
    clock.advance(2 * 3_600)  # a quiet stretch longer than the escalation window
    loop_until_refused(established, clock, per_minute=5_000)
    open_until = established.status(KEY).open_until
    assert open_until is not None
    assert open_until - (clock.now - 2) == pytest.approx(60)


@pytest.mark.parametrize(
    ("gap", "cooldown"),
    [
        pytest.param(600.0, 120.0, id="at-the-window-escalates"),
        pytest.param(600.5, 60.0, id="past-the-window-starts-over"),
    ],
)
def test_escalation_window_boundary(clock: Clock, gap: float, cooldown: float) -> None:
    fuse = make_fuse(clock, limit=100, cooldown=60, escalation_window=600)
    assert fuse.record(KEY, 1_000).tripped
    clock.advance(gap)
    second = fuse.record(KEY, 1_000)
    assert second.tripped
    assert second.error is not None
    assert second.error.retry_after == cooldown


def test_cooldown_is_capped(clock: Clock) -> None:
    fuse = make_fuse(clock, limit=100, cooldown=60, cooldown_max=300)
    cooldowns = []
    for _ in range(6):
        assert fuse.record(KEY, 1_000).tripped
        open_until = fuse.status(KEY).open_until
        assert open_until is not None
        cooldowns.append(open_until - clock.now)
        clock.advance(open_until - clock.now)
    assert cooldowns == [60, 120, 240, 300, 300, 300]


def test_refusals_carry_retry_after_and_add_nothing(established: Fuse, clock: Clock) -> None:
    loop_until_refused(established, clock, per_minute=5_000)
    refusal = established.gate(KEY)
    assert refusal.error is not None
    assert 0 < refusal.error.retry_after <= 60
    clock.advance(30)
    later = established.gate(KEY)
    assert later.error is not None
    assert later.error.retry_after == pytest.approx(refusal.error.retry_after - 30)
    clock.advance(31)
    assert established.status(KEY).rate < 5_000 * 0.1  # the window drained while open


def test_reset_closes_the_key_at_once(established: Fuse, clock: Clock) -> None:
    loop_until_refused(established, clock, per_minute=5_000)
    established.reset(KEY)
    assert established.gate(KEY).allowed
    assert established.record(KEY, 5).allowed  # the window was cleared too
    assert established.status(KEY).baseline == pytest.approx(300, rel=0.01)


def test_baseline_follows_slow_growth_without_tripping(clock: Clock) -> None:
    fuse = make_fuse(clock, cold_start_limit=None)
    per_minute = 300.0
    trips = 0
    for _ in range(21):  # three weeks, growing 8% a day: triples without a single trip
        trips += steady(fuse, clock, per_minute=per_minute, seconds=DAY, every=30)
        per_minute *= 1.08
    assert trips == 0
    baseline = fuse.status(KEY).baseline
    assert baseline is not None
    assert per_minute / 1.08 / baseline < 1.2  # within a day or so of the current level


def test_idle_minutes_are_not_zeros(clock: Clock) -> None:
    fuse = make_fuse(clock, cold_start_limit=None)
    for _ in range(5):  # active one hour a day at 1,200/min, idle the rest
        steady(fuse, clock, per_minute=1_200, seconds=3_600, every=10)
        clock.advance(DAY - 3_600)
    assert fuse.status(KEY).baseline == pytest.approx(1_200, rel=0.01)


def test_week_replay_with_a_daily_large_call_has_no_false_trip(clock: Clock) -> None:
    """1k tokens/min plus one 40k-token call a day, for a week."""
    fuse = make_fuse(clock, cold_start_limit=None)
    steady(fuse, clock, per_minute=1_000, seconds=3.5 * DAY, every=15)
    trips = 0
    spikes_seen = 0
    for _ in range(7):
        trips += steady(fuse, clock, per_minute=1_000, seconds=DAY / 2, every=15)
        decision = fuse.record(KEY, 40_000)
        trips += decision.tripped
        assert decision.baseline is not None
        spikes_seen += decision.rate >= 10 * decision.baseline
        trips += steady(fuse, clock, per_minute=1_000, seconds=DAY / 2, every=15)
    assert spikes_seen == 7  # each big call did lift the rate past the multiple...
    assert trips == 0  # ...and none of them was taken for a loop


@pytest.mark.parametrize(
    ("multiple", "trips"),
    [
        pytest.param(12.0, True, id="12x-trips"),
        pytest.param(10.5, True, id="10.5x-trips"),
        pytest.param(8.0, False, id="8x-allowed"),
        pytest.param(3.0, False, id="3x-allowed"),
    ],
)
def test_spike_threshold(established: Fuse, clock: Clock, multiple: float, trips: bool) -> None:
    tripped = steady(established, clock, per_minute=300 * multiple, seconds=120, every=2)
    assert bool(tripped) is trips


# -- what the baseline learns, on the core state --------------------------------------------

MINUTE = 60.0
T0 = 1_767_225_600.0  # on a minute boundary
LEARNING = VelocityPolicy(limit=1_000, cold_start_limit=None, cooldown=60)


def spend(state: core.VelocityState, minute: float, amount: float) -> core.VelocityVerdict:
    return core.record(state, amount, T0 + minute * MINUTE, LEARNING)


@pytest.mark.parametrize(
    "spending",
    [
        # Minute 1 idle; the trip at minute 2.5 keeps the key open until 3.5, and an in-flight
        # call lands in minute 3 while it is open.
        pytest.param(
            [(0, 100), (2.5, 5_000), (3.2, 700), (5, 100), (7, 100), (9, 100), (30, 100)],
            id="the-window-of-a-trip-and-its-open-minutes-are-not-learned",
        ),
        # Minute 1 looked clean when it ended (the loop starting, under the limit); the trip
        # in the next minute drops it with the rest of the window.
        pytest.param(
            [(0, 100), (1.5, 900), (2.2, 5_000), (4, 100), (6, 100), (8, 100), (30, 100)],
            id="the-minutes-before-a-trip-are-not-learned",
        ),
    ],
)
def test_a_loop_is_not_learned(spending: list[tuple[float, float]]) -> None:
    state = core.new_state(T0)
    trips = [spend(state, minute, amount).tripped for minute, amount in spending]
    assert trips.count(True) == 1
    # Learned: the three minutes of 100 after the key closed, once they left the 10-minute
    # window (the call at minute 30). Learning any minute up to the trip, or while the key was
    # open, would add a sample and lift the baseline.
    assert state.samples == 3
    assert state.baseline == pytest.approx(100, rel=1e-12)


def test_a_clean_minute_is_learned_when_it_leaves_the_ten_minute_window() -> None:
    state = core.new_state(T0)
    spend(state, 0, 100)
    spend(state, 1, 300)
    spend(state, 10.5, 100)
    assert state.samples == 0  # minute 0 is still in the window: a trip now would drop it
    spend(state, 11, 100)
    assert (state.samples, state.baseline) == (1, 100)
    spend(state, 12, 100)
    assert state.samples == 2
    assert 100 < state.baseline < 300
