"""Rate strings: the shorthand people write, and every form ``limits`` (slowapi) accepts."""

from __future__ import annotations

import pytest
from limits import parse

from tests.conftest import Clock
from tokenfuse import BucketPolicy, ConfigurationError, Fuse, MemoryStore, VelocityPolicy
from tokenfuse._core.rates import per_minute, per_second


@pytest.mark.parametrize(
    ("text", "minute"),
    [
        ("50k/min", 50_000),
        ("50K/Min", 50_000),
        ("1M/hour", 1e6 / 60),
        ("2.5k/s", 150_000),
        ("2.5k / sec", 150_000),
        ("300 per 5 minutes", 60),
        ("1.5M per 2 hours", 12_500),
        ("14.4k/d", 10),
        ("7200/h", 120),
        ("90/mins", 90),
    ],
)
def test_shorthand_rates_are_read(text: str, minute: float) -> None:
    assert per_minute(text) == pytest.approx(minute)
    assert per_second(text) == pytest.approx(minute / 60)


@pytest.mark.parametrize(
    "text",
    [
        "50000/minute",
        "10/second",
        "10 per second",
        "5 per 2 minutes",
        "100/hour",
        "3/days",
        "1/month",
        "2 per year",
        "7 PER MINUTE",
    ],
)
def test_limits_strings_mean_what_they_mean_in_limits(text: str) -> None:
    item = parse(text)
    assert per_minute(text) == pytest.approx(item.amount * 60 / item.get_expiry())
    assert per_second(text) == pytest.approx(item.amount / item.get_expiry())


def test_numbers_are_per_minute_or_per_second_as_named() -> None:
    assert per_minute(120) == 120.0
    assert per_second(2.5) == 2.5


@pytest.mark.parametrize(
    "text",
    ["lots", "", "50000", "-5/min", "50m/min", "5/fortnight", "1e6/min", "k/min", "5//min"],
)
def test_garbage_is_a_clear_error(text: str) -> None:
    with pytest.raises(ConfigurationError, match=r"limit: cannot read .* like .*'50k/min'"):
        per_minute(text, "limit")


def test_several_rates_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="names 2 rates; give one"):
        per_second("10/second;100/minute")


@pytest.mark.parametrize("text", ["5/0 minutes", "5 per 0 seconds"])
def test_a_period_of_zero_is_refused(text: str) -> None:
    with pytest.raises(ConfigurationError, match="longer than zero"):
        per_minute(text)


def test_every_option_that_takes_a_rate_takes_the_shorthand(clock: Clock) -> None:
    velocity = VelocityPolicy(limit="50k/min", min_baseline="6k/hour", cold_start_limit="1M/hour")
    assert (velocity.limit, velocity.min_baseline) == (50_000, 100)
    assert velocity.cold_start_limit == pytest.approx(1e6 / 60)
    assert BucketPolicy(rate="2.5k/min", capacity=50).rate == pytest.approx(2_500 / 60)

    fuse = Fuse(MemoryStore(clock=clock), bucket=BucketPolicy(rate=1, capacity=10))
    fuse.set_limit("agent-1", "1.2k/min")
    refusal = fuse.record("agent-1", 1_201).error
    assert refusal is not None
    assert refusal.limit == 1_200
    fuse.set_bucket("agent-2", rate="0.006k/min", capacity=1)  # one call per 10 s
    assert fuse.admit("agent-2", amount=0).allowed
    quota = fuse.admit("agent-2", amount=0).error
    assert quota is not None
    assert quota.retry_after == pytest.approx(10)
