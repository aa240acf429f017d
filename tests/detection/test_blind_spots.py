"""The blind spots of the first velocity check, replayed through a fuse on a simulated clock.

Each scenario is the one ``benchmarks/detection.py`` puts in the table of docs/detection.md,
with a warm-up of the default learning period (3.5 days) in few calls, so a replay takes
about a second.
"""

from __future__ import annotations

import random

import pytest
from benchmarks.detection_scenarios import (
    DAY,
    HOUR,
    MINUTE,
    WARM,
    Outcome,
    Scenario,
    SimClock,
    Traffic,
    loop,
    looping,
    normal,
    poisson,
    replay,
)

from tokenfuse import Fuse, MemoryStore, VelocityPolicy


def capture(fuses: list[Fuse]) -> object:
    """A fuse factory for ``replay`` that keeps the fuse, to read its status afterwards."""

    def make(clock: SimClock) -> Fuse:
        fuses.append(Fuse(MemoryStore(clock=clock)))
        return fuses[-1]

    return make


# (1) -------------------------------------------------------------------------------------------


def large_calls(size: float, every: float, at: float = WARM) -> Scenario:
    """An established key of 2,000 tokens/min (a call of 1,000 every 30 s), then one large
    call after another: the 60 s window holds one of them at a time, so the spike rule alone
    (which leaves out the window's largest call) never sees them."""
    days = at / DAY + 1 / 24

    def traffic(rng: random.Random) -> Traffic:
        background = loop(0.0, days * DAY, 2_000, 1_000, phase=0)
        return normal(background, loop(at, days * DAY, size * MINUTE / every, size))

    return Scenario("large calls", "blind spot", days, traffic, loops=((at, days * DAY),))


def first_trip(out: Outcome, after: float) -> tuple[float, str]:
    return min((t - after, reason) for t, reason, _ in out.trips if t >= after)


@pytest.mark.parametrize(
    ("size", "every"),
    [
        pytest.param(30_000.0, 70.0, id="30k-every-70s-13x"),
        pytest.param(150_000.0, 70.0, id="150k-every-70s-64x"),
        pytest.param(30_000.0, 61.0, id="30k-every-61s"),
    ],
)
def test_large_calls_are_refused_at_the_second_one(size: float, every: float) -> None:
    out = replay(large_calls(size, every))
    assert out.false_trips == 0
    after, reason = first_trip(out, WARM)
    assert after == every  # at 61 s the first call is still partly in the 60 s window
    assert reason == ("loop_sparse" if every > 61 else "loop_suspected")
    if reason == "loop_sparse":
        assert "large calls repeating" in out.errors[1]
    assert out.spent[1] == 2 * size


@pytest.mark.parametrize("phase", [i * 0.5 for i in range(10)])
def test_a_large_call_every_60_s_is_refused_whatever_its_phase(phase: float) -> None:
    out = replay(large_calls(30_000, 60, at=WARM + phase))
    assert first_trip(out, WARM + phase)[0] <= 2 * MINUTE


# (2) -------------------------------------------------------------------------------------------


def eight_then_thirty(rng: random.Random) -> Traffic:
    background = poisson(rng, 0.0, WARM + 7 * HOUR, 300, size=100)
    eight = loop(WARM, WARM + 6 * HOUR, 2_100, 100, phase=1)  # 7x on top of the key's 1x
    thirty = loop(WARM + 6 * HOUR, WARM + 7 * HOUR, 8_700, 100, phase=2)
    return normal(background, eight, thirty)


def test_a_sustained_8x_loop_is_refused_within_ten_minutes_and_teaches_nothing() -> None:
    fuses: list[Fuse] = []
    scenario = Scenario(
        "8x then 30x", "blind spot", WARM / DAY + 7 / 24, eight_then_thirty,
        loops=((WARM, WARM + 6 * HOUR), (WARM + 6 * HOUR, WARM + 7 * HOUR)), stop=False,
    )  # fmt: skip
    before = replay(scenario, days=WARM / DAY, fuse=capture(fuses))  # type: ignore[arg-type]
    assert before.trips == []
    out = replay(scenario, fuse=capture(fuses))  # type: ignore[arg-type]
    assert out.false_trips == 0
    assert out.refused[1] - WARM <= 10 * MINUTE
    assert "over 10 min" in out.errors[1] and ", sustained" in out.errors[1]
    # Six hours of the loop, refused again at every return: the baseline never learned it
    # (before, it rose from 318 to 1,407 in a day), so a 30x loop is still caught in seconds.
    baseline, learned = (fuse.status("agent").learned_baseline for fuse in fuses)
    assert learned == pytest.approx(baseline, rel=0.01)
    assert out.refused[2] - (WARM + 6 * HOUR) <= MINUTE


# (3) -------------------------------------------------------------------------------------------


def test_a_new_key_looping_under_the_cold_start_ceiling_is_refused_within_ten_minutes() -> None:
    scenario = Scenario(
        "new key at 95k/min", "blind spot", 1.0,
        lambda rng: loop(0.0, DAY, 95_000, 3_000), loops=((0.0, DAY),), stop=False,
    )  # fmt: skip
    out = replay(scenario)
    assert out.refused[1] <= 10 * MINUTE
    message = out.errors[1]
    assert "cold-start budget" in message and "over 10 min" in message
    for fix in ("fuse.forgive(key)", "fuse.set_limit(key, ...)", "cold_start_sustained=..."):
        assert fix in message
    # Refused again each time it comes back, for longer each time: over a day it spends less
    # than a quarter of the 137M tokens it would have.
    assert {reason for _, reason, _ in out.trips} == {"cold_start_budget"}
    assert out.recorded * 3_000 < 0.25 * 95_000 * 1_440


def test_a_live_limit_lifts_cold_start_for_one_busy_new_key() -> None:
    clock = SimClock()
    fuse = Fuse(MemoryStore(clock=clock))
    fuse.set_limit("team", 500_000)
    for _ in range(3 * 60 * 20):  # three hours of 150,000 tokens/min, from the first call
        assert fuse.record("team", 7_500).allowed
        assert fuse.gate("team").allowed
        clock.now += 3
    assert not fuse.record("team", 400_000).allowed  # the key's own limit still holds
    assert fuse.record("other", 110_000).allowed  # another new key: one call is no loop...
    other = fuse.record("other", 110_000)  # ...but it is still under cold start
    assert other.error is not None and other.error.reason == "cold_start_ceiling"


# (5) -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("multiple", "within"),
    [
        pytest.param(12, 60.0, id="12x"),  # the 60 s contract: 3 calls a minute say too little
        pytest.param(15, 45.0, id="15x"),
        pytest.param(30, 15.0, id="30x"),
        pytest.param(100, 3.0, id="100x"),
    ],
)
def test_loops_on_a_key_of_three_calls_a_minute(multiple: int, within: float) -> None:
    out = replay(looping(300, 100, multiple))
    assert out.false_trips == 0
    assert out.refused[1] - WARM <= within


def test_a_12x_loop_on_a_key_of_30_calls_a_minute_is_refused_within_15_s() -> None:
    # Established after 6 hours instead of 3 days, to keep the replay short.
    scenario = looping(3_000, 100, 12, at=7 * HOUR, policy={"learning_period": 6 * HOUR})
    out = replay(scenario)
    assert out.false_trips == 0
    assert out.refused[1] - 7 * HOUR <= 15.0
    message = out.errors[1]
    assert "far more calls than its usual pace (early check)" in message
    assert message.startswith("possible agent loop or retry storm: ")


def test_the_early_check_is_page_s_cusum_tuned_to_the_spike_multiple() -> None:
    # The bucket fills one typical call per call and drains at spike_multiple times the key's
    # usual call rate: a loop just under the multiple never trips it, however long it runs.
    scenario = looping(3_000, 100, 9.5, at=7 * HOUR, policy={"learning_period": 6 * HOUR})
    out = replay(scenario, days=7 / 24 + 10 / (24 * 60))  # ten minutes of the loop
    assert 1 not in out.refused or "early check" not in out.errors[1]


def test_trips_name_their_rule_window_and_numbers() -> None:
    out = replay(looping(300, 100, 100))
    reasons = {reason for _, reason, _ in out.trips}
    assert reasons == {"loop_early"}
    clock = SimClock()
    fuse = Fuse(MemoryStore(clock=clock), velocity=VelocityPolicy(cold_start_limit=1_000))
    # one call over what the ten-minute budget allows (10 x 600): a minute may not hold it
    decision = fuse.record("k", 7_000)
    error = decision.error
    assert error is not None
    assert (error.reason, error.window, error.rate, error.limit) == (
        "cold_start_ceiling", 60.0, 7_000.0, 6_000.0,
    )  # fmt: skip
    assert error.as_dict()["window"] == 60.0
