"""Normal traffic is not refused; loops hidden in bursty traffic are, where the data allows.

Replays of the table's normal profiles (a week each; the benchmark replays 30 days) and of
the synthetic production traffic of ``benchmarks/detection_scenarios.py``.
"""

from __future__ import annotations

import random

import pytest
from benchmarks.detection_scenarios import (
    DAY,
    HOUR,
    MINUTE,
    Scenario,
    production,
    replay,
    scenarios,
)

PROFILES = {s.name: s for s in scenarios(quick=True) if s.group == "normal"}
# Left to the benchmark: sessions (bursty, tested as production traffic below) and the surge
# on a 2,000/min key (100,000 calls; the same surge on a 300/min key is the noisier case).
LEFT = ("sessions", "legit 6x surge for 2 days, 2,000/min key")


@pytest.mark.parametrize("name", [name for name in PROFILES if not name.startswith(LEFT)])
def test_a_week_of_normal_traffic_is_never_refused(name: str) -> None:
    out = replay(PROFILES[name])
    assert out.trips == []


def test_the_synthetic_production_traffic_has_the_average_it_is_built_for() -> None:
    calls = list(production(random.Random(3), 0.0, 28 * DAY, 15_000))
    average = sum(amount for _, amount, _ in calls) / (28 * 1_440)
    assert average == pytest.approx(15_000, rel=0.1)
    busiest = max(amount for _, amount, _ in calls)
    assert busiest == 200_000  # heavy-tailed, up to a full context window


def test_a_busy_production_key_is_not_refused_in_its_first_three_days() -> None:
    # Blind spot (6): 66 refusals from the 100,000/min cold-start ceiling before (see the
    # table); the ceilings now follow what the key has shown.
    key = Scenario(
        "production 15,000/min", "production", 3.0,
        lambda rng: production(rng, 0.0, 3 * DAY, 15_000),
    )  # fmt: skip
    assert replay(key).trips == []


@pytest.mark.slow
def test_a_loop_at_12x_the_average_of_a_busy_production_key_is_refused() -> None:
    # Blind spot (7), on a key of 60,000/min: a loop of typical calls at 12x its average,
    # idle time included, at 09:00 on a weekday.
    (scenario,) = [s for s in scenarios() if s.name == "(7) 12x-average loop, 60,000/min avg #1"]
    out = replay(scenario)
    start = scenario.loops[0][0]
    assert start == 7 * DAY + 9 * HOUR
    assert out.refused[1] - start <= 10 * MINUTE


MONTH = {s.name: s for s in scenarios() if s.group in ("normal", "production")}


@pytest.mark.parametrize(
    "name", ["(6) production, 1,000/min avg", "sessions (~1,500/min avg, bursty)"]
)
def test_a_month_of_bursty_production_traffic_is_never_refused(name: str) -> None:
    # A sparse key's sessions reach 263x its average in a minute: 7 and 4 false trips in 30
    # days when the contract judged them against the mean active minute and cold start
    # waited for 60 learned minutes (docs/detection.md); none against the busy minute.
    scenario = MONTH[name]
    assert scenario.days == 30
    assert replay(scenario).trips == []


@pytest.mark.slow
def test_a_month_of_a_busy_production_key_is_never_refused() -> None:
    out = replay(MONTH["(6) production, 60,000/min avg"])  # 6 false trips before
    assert out.trips == []
