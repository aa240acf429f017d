"""Each detection rule on its own, driven through Fuse on a simulated clock (docs/detection.md).

Policies switch the other rules off (or out of reach) where a test watches one rule, so a
test fails when its rule is broken, not when another one fires first.
"""

from __future__ import annotations

import math

import pytest

from tests.conftest import Clock
from tokenfuse import Fuse, MemoryStore, VelocityPolicy
from tokenfuse._core import velocity

MINUTE = 60.0
HOUR = 3_600.0
DAY = 86_400.0
KEY = "k"


def make_fuse(clock: Clock, **policy: object) -> Fuse:
    return Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(**policy))  # type: ignore[arg-type]


def steady(fuse: Fuse, clock: Clock, per_minute: float, minutes: float, every: float = 20.0) -> int:
    """Evenly spaced calls worth ``per_minute``; returns how many tripped."""
    trips = 0
    for _ in range(round(minutes * MINUTE / every)):
        trips += fuse.record(KEY, per_minute * every / MINUTE).tripped
        clock.advance(every)
    return trips


QUICK = {"learning_period": 0.0, "min_samples": 30}  # established within the hour


# -- the early check ------------------------------------------------------------------------------


def test_the_early_check_trips_after_threshold_calls_beyond_the_spike_pace(clock: Clock) -> None:
    fuse = make_fuse(clock, **QUICK, early_threshold=5)
    assert steady(fuse, clock, 600, 60, every=10) == 0  # 6 calls a minute of 100
    # A burst of calls of the usual size, one a second: the bucket drains one a second too
    # (10 x 6 calls a minute), so only the calls beyond that pace fill it.
    start = clock.now
    calls = 0
    while not (decision := fuse.record(KEY, 100)).tripped and calls < 50:
        calls += 1
        clock.advance(0.5)
    error = decision.error
    assert error is not None and error.reason == "loop_early"
    assert 8 <= calls <= 10  # 2 calls a second in, 1 out: 5 in excess after about 10 calls
    n = calls + 1
    assert error.window == pytest.approx(clock.now - start)
    assert error.rate == pytest.approx(100 * n / error.window * MINUTE)
    assert error.multiple == pytest.approx(error.rate / 600)


def test_the_early_check_counts_a_large_call_as_one(clock: Clock) -> None:
    fuse = make_fuse(clock, **QUICK, early_threshold=5, spike_multiple=1_000, ceiling_multiple=None)
    assert steady(fuse, clock, 600, 60, every=10) == 0
    for _ in range(4):  # calls of 50x the usual size, at once: each counts as one, not 50
        assert not fuse.record(KEY, 5_000).tripped
    decision = fuse.record(KEY, 5_000)  # the fifth
    assert decision.error is not None and decision.error.reason == "loop_early"
    assert decision.error.window == 1.0  # a burst at one instant is reported over a second


# -- sparse large calls ---------------------------------------------------------------------------


def test_a_large_call_is_excused_once_and_not_again_while_the_pair_runs_at_10x(
    clock: Clock,
) -> None:
    fuse = make_fuse(clock, **QUICK)
    assert steady(fuse, clock, 1_000, 60) == 0
    assert fuse.record(KEY, 30_000).allowed  # 30x in the window, but one call
    for _ in range(10):  # the same call is not excused twice
        clock.advance(5)
        assert fuse.record(KEY, 300).allowed
    clock.advance(60)
    decision = fuse.record(KEY, 30_000)  # 115 s later: 60,000 over 115 s is over 10x
    error = decision.error
    assert error is not None and error.reason == "loop_sparse"
    assert error.window in (110.0, 115.0)  # measured between the calls' 5 s slots
    assert error.rate == pytest.approx(60_000 / error.window * MINUTE)


def test_large_calls_far_apart_are_each_excused(clock: Clock) -> None:
    fuse = make_fuse(clock, **QUICK)
    assert steady(fuse, clock, 1_000, 60) == 0
    for _ in range(5):  # 30,000 every 10 minutes: 3x on average
        assert fuse.record(KEY, 30_000).allowed
        assert steady(fuse, clock, 1_000, 10) == 0


# -- sustained elevation --------------------------------------------------------------------------


def test_sustained_elevation_is_judged_against_the_average_with_idle_time(clock: Clock) -> None:
    # Active all day at 1,000/min: average and baseline agree, the 7.5x multiple applies.
    fuse = make_fuse(clock, **QUICK, early_threshold=None)
    assert steady(fuse, clock, 1_000, 120) == 0
    assert steady(fuse, clock, 7_000, 10) == 0
    first = None
    for _ in range(30):
        decision = fuse.record(KEY, 8_500 * 20 / MINUTE)
        first = first or decision.error
        clock.advance(20)
    assert first is not None and first.reason == "loop_sustained"
    assert first.limit == pytest.approx(7.5 * first.baseline)  # the average binds here


def test_a_key_idle_most_of_the_day_is_judged_against_its_active_baseline(clock: Clock) -> None:
    # Active one hour a day at 1,000/min: its average with idle time is ~42/min, so 7.5x of
    # it would refuse its own normal hour; the floor of 6x the active baseline does not.
    fuse = make_fuse(clock, learning_period=DAY, early_threshold=None)
    for _ in range(3):
        assert steady(fuse, clock, 1_000, 60) == 0
        clock.advance(DAY - HOUR)
    assert steady(fuse, clock, 1_000, 60) == 0  # its normal hour: 24x its average
    clock.advance(HOUR)
    tripped = None
    for _ in range(60):
        decision = fuse.record(KEY, 7_000 * 10 / MINUTE)
        tripped = decision.error if decision.tripped else tripped
        clock.advance(10)
    assert tripped is not None and tripped.reason == "loop_sustained"
    assert tripped.window == 600.0
    assert tripped.limit == pytest.approx(6 * 1_000, rel=0.02)
    assert tripped.baseline is not None and tripped.baseline < 100  # the average, idle included
    assert "the average (idle time included)" in str(tripped)


# -- bursty keys ----------------------------------------------------------------------------------

ONLY_THE_SPIKE = {
    **QUICK, "early_threshold": None, "sustained_multiple": 1e6,
    "sustained_baseline_multiple": 1e6, "cold_start_limit": None,
}  # fmt: skip


def bursty(fuse: Fuse, clock: Clock, minutes: int) -> None:
    """A minute of 3,400 after three of 200, one call a minute: a mean of 1,000 a minute and
    a root mean square of 1,709."""
    for minute in range(minutes):
        assert fuse.record(KEY, 3_400.0 if minute % 4 == 3 else 200.0).allowed
        clock.advance(MINUTE)


@pytest.mark.parametrize("rms_share", [0.9, None])
def test_a_bursty_key_is_judged_against_its_typical_busy_minute(
    clock: Clock, rms_share: float | None
) -> None:
    fuse = make_fuse(clock, **ONLY_THE_SPIKE, rms_share=rms_share)
    bursty(fuse, clock, 80)
    learned = fuse.status(KEY).learned_baseline
    assert learned == pytest.approx(1_000, rel=0.05)
    # 12,000 in a minute, 11,000 without its largest call: 11x the mean, 7x the busy minute
    decisions = []
    for _ in range(12):
        decisions.append(fuse.record(KEY, 1_000))
        clock.advance(4.5)
    tripped = [d.error for d in decisions if d.tripped]
    if rms_share is None:  # the mean alone: the 10x contract trips
        assert tripped and tripped[0] is not None and tripped[0].reason == "loop_suspected"
        return
    assert tripped == []
    # ...while a minute at over 10x the busy minute still trips, and says against what
    clock.advance(2 * MINUTE)
    for _ in range(20):
        decision = fuse.record(KEY, 1_000)
        if decision.tripped:
            break
        clock.advance(2.9)
    error = decision.error
    assert error is not None and error.reason == "loop_suspected"
    rms = math.sqrt((3 * 200.0**2 + 3_400.0**2) / 4)
    assert error.baseline == pytest.approx(0.9 * rms, rel=0.05)
    assert error.limit == pytest.approx(10 * error.baseline)


@pytest.mark.parametrize(("samples", "tripped"), [(20, False), (60, True)])
def test_cold_start_follows_the_key_after_cold_start_samples(
    clock: Clock, samples: int, tripped: bool
) -> None:
    fuse = make_fuse(clock, cold_start_samples=samples)  # established after 3 days
    assert steady(fuse, clock, 20_000, 35) == 0  # 25 learned minutes of 20,000/min
    assert 20 <= fuse.status(KEY).samples < 60
    trips = steady(fuse, clock, 140_000, 1, every=5)  # over 100,000, under 10 x shown
    assert (trips > 0) is tripped


# -- ceilings -------------------------------------------------------------------------------------


def test_an_established_key_keeps_a_ceiling_of_its_own(clock: Clock) -> None:
    fuse = make_fuse(clock, **QUICK, cold_start_limit=50_000)
    assert steady(fuse, clock, 1_000, 60) == 0
    assert fuse.record(KEY, 90_000).allowed  # one call: over the cold-start ceiling, not 100x
    clock.advance(HOUR)
    baseline = fuse.status(KEY).baseline
    assert baseline is not None
    decision = fuse.record(KEY, 150_000)
    assert decision.error is not None and decision.error.reason == "baseline_ceiling"
    # 100x the key's normal minute: its baseline, or a bit more once the 90,000 minute made
    # it bursty (rms_share of its minutes' root mean square)
    normal = decision.error.baseline
    assert normal is not None and baseline <= normal < 1.5 * baseline
    assert decision.error.limit == pytest.approx(100 * normal)


def test_no_cold_start_ceiling_means_no_ceiling_of_its_own(clock: Clock) -> None:
    fuse = make_fuse(clock, **QUICK, cold_start_limit=None)
    assert steady(fuse, clock, 1_000, 60) == 0
    assert fuse.record(KEY, 500_000).allowed


def test_cold_start_adapts_to_what_the_key_has_shown(clock: Clock) -> None:
    fuse = make_fuse(clock)  # the defaults: established after 3 days
    assert steady(fuse, clock, 20_000, 90) == 0  # 80 learned minutes of 20,000/min
    assert steady(fuse, clock, 140_000, 1, every=5) == 0  # 7x: over 100,000, under 10 x shown
    assert fuse.record("new", 60_000).allowed
    # 120,000 on a key that showed nothing: over 100,000 with the largest call only
    assert fuse.record("new", 60_000).allowed
    refused = fuse.record("new", 60_000).error  # 120,000 without it
    assert refused is not None and refused.reason == "cold_start_ceiling"


def test_a_new_key_may_send_one_call_as_large_as_its_ten_minute_budget(clock: Clock) -> None:
    fuse = make_fuse(clock, cold_start_limit=10_000)  # budget: 6,000/min, 60,000 in 10 min
    assert fuse.record(KEY, 50_000).allowed  # over the 10,000 floor, but one call
    for _ in range(60):  # and 5,000/min beside it for ten minutes: within the budget
        assert fuse.record(KEY, 5_000 * 10 / MINUTE).allowed
        clock.advance(10)
    clock.advance(2 * MINUTE)  # the first large call has left the ten-minute window
    assert fuse.record(KEY, 50_000).allowed
    clock.advance(1)
    refused = fuse.record(KEY, 50_000).error  # a second one in the minute is no single call
    assert refused is not None and refused.reason == "cold_start_ceiling"
    assert refused.limit == 10_000


def test_the_cold_start_budget_bounds_ten_minutes_and_says_what_to_change(clock: Clock) -> None:
    fuse = make_fuse(clock, cold_start_limit=10_000)  # budget: 6,000/min over 10 minutes
    trips = []
    for _ in range(200):
        decision = fuse.record(KEY, 8_000 * 10 / MINUTE)
        if decision.tripped:
            trips.append((clock.now, decision.error))
        clock.advance(10)
    at, error = trips[0]
    assert error is not None and error.reason == "cold_start_budget"
    assert at - 1_767_225_600.0 == pytest.approx(6_000 / 8_000 * 600, abs=20)
    message = str(error)
    assert "cold-start budget" in message and "over 10 min" in message
    assert "VelocityPolicy(cold_start_sustained=...)" in message


# -- what the baseline learns --------------------------------------------------------------------


def test_a_minute_far_above_the_baseline_is_learned_clipped(clock: Clock) -> None:
    fuse = make_fuse(clock, **QUICK, spike_multiple=1e6, early_threshold=None,
                     sustained_multiple=1e6, sustained_baseline_multiple=1e6,
                     cold_start_limit=None)  # fmt: skip
    assert steady(fuse, clock, 100, 70) == 0
    before = fuse.status(KEY)
    assert fuse.record(KEY, 100_000).allowed  # one minute at 1,000x
    clock.advance(12 * MINUTE)
    after = fuse.status(KEY)
    assert after.samples > before.samples  # the minute was learned...
    assert after.learned_baseline < before.learned_baseline * 1.2  # as 8x (+11 %), not 17x


def test_the_run_up_to_a_trip_is_not_learned(clock: Clock) -> None:
    fuse = make_fuse(clock, **QUICK, early_threshold=None)
    assert steady(fuse, clock, 100, 60) == 0
    before = fuse.status(KEY).learned_baseline
    assert steady(fuse, clock, 300, 9) == 0  # 3x: allowed, and the loop's run-up
    assert fuse.record(KEY, 2_000).allowed  # one large call, excused...
    clock.advance(1)
    assert fuse.record(KEY, 1_500).tripped  # ...but not with more beside it
    clock.advance(MINUTE)
    assert steady(fuse, clock, 100, 30) == 0
    assert fuse.status(KEY).learned_baseline == pytest.approx(before, rel=0.01)


# -- forgiving teaches the hour ------------------------------------------------------------------


@pytest.mark.parametrize("rate", [1.5, 300.0, 10_000.0, 1e6, 1e8])
def test_each_hour_keeps_its_allowance_rounded_up_to_an_eighth_of_an_octave(rate: float) -> None:
    state = velocity.new_state(0.0)
    for hour in range(24):  # 24 allowances packed six to a double, each its own
        velocity._teach(state, hour, rate * (hour + 1))
    for hour in range(24):
        expected = rate * (hour + 1)
        assert expected <= velocity._allowance(state, hour * HOUR) < expected * 2 ** (1 / 8)
    assert len(state.profile) == 4 and all(math.isfinite(w) for w in state.profile)


def test_an_allowance_saturates_at_the_top_of_its_byte() -> None:
    state = velocity.new_state(0.0)
    velocity._teach(state, 5, 1e12)
    assert velocity._allowance(state, 5 * HOUR) == 2 ** (255 / 8)  # about 3.9 billion a minute
    assert velocity._allowance(state, 6 * HOUR) == 0.0


def test_forgive_raises_an_allowance_and_never_lowers_it() -> None:
    state = velocity.new_state(0.0)
    for rate in (5_000.0, 1_000.0):
        state.last_trip, state.trip_rate, state.trip_reason = 2 * HOUR + 5, rate, 2
        velocity.forgive(state)
    assert velocity._allowance(state, 2 * HOUR) >= 5_000
    assert velocity._allowance(state, 3 * HOUR) >= 5_000  # the next hour too
    assert velocity._allowance(state, 4 * HOUR) == 0.0
    assert velocity._allowance(state, 1 * HOUR) == 0.0
