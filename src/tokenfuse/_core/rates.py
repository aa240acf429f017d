"""Rates as people write them: ``50000/minute``, ``50k/min``, ``1M/hour``, ``2.5k/s``.

A rate string is an amount, ``/`` or ``per``, an optional multiple and a unit of time:

* the amount may carry a thousands (``k``) or millions (``M``) suffix and decimals: ``2.5k``;
* the unit is ``s``/``sec``/``second``, ``min``/``minute``, ``h``/``hr``/``hour`` or
  ``d``/``day`` (plurals too, any case): ``1M/hour``, ``300 per 5 minutes``.

Every string the ``limits`` package (and so slowapi) accepts for one rate works too, with the
meaning it has there (``"10/second"``, ``"5 per 2 minutes"``, ``"1/month"``).
"""

from __future__ import annotations

import math
import re

from .._errors import ConfigurationError

__all__ = ["per_minute", "per_second"]

_SHORT = re.compile(
    r"""^\s*
    (?P<amount>[0-9]+(?:\.[0-9]+)?)\s*(?P<suffix>[kKM]?)
    \s*(?:/|per)\s*
    (?P<multiple>[0-9]+)?\s*
    (?P<unit>[a-zA-Z]+)
    \s*$""",
    re.VERBOSE,
)
_SUFFIXES = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6}
_UNITS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1.0),
    **dict.fromkeys(("min", "mins", "minute", "minutes"), 60.0),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3_600.0),
    **dict.fromkeys(("d", "day", "days"), 86_400.0),
}
_EXAMPLES = "'50000/minute', '50k/min', '1M/hour' or '2.5k/s'"


def _per(value: float | str, seconds: float, what: str) -> float:
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be a number or a rate string, not {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        amount, period = _parse(value, what)
        number = amount * seconds / period
    else:
        raise ConfigurationError(f"{what} must be a number or a rate string, not {value!r}")
    if not math.isfinite(number) or number < 0:
        raise ConfigurationError(f"{what} must be a finite, non-negative rate, not {value!r}")
    return number


def _parse(text: str, what: str) -> tuple[float, float]:
    """(amount, period in seconds) of the rate ``text`` names."""
    short = _SHORT.match(text)
    if short is not None and short["unit"].lower() in _UNITS:
        amount = float(short["amount"]) * _SUFFIXES[short["suffix"]]
        period = int(short["multiple"] or 1) * _UNITS[short["unit"].lower()]
    else:
        amount, period = _parse_with_limits(text, what)
    if period <= 0:
        raise ConfigurationError(f"{what}: the period of {text!r} must be longer than zero")
    return amount, period


def _parse_with_limits(text: str, what: str) -> tuple[float, float]:
    # Only what the short form does not cover gets here (months, years, lists of rates).
    from limits import parse_many  # imported lazily: only configuration pays for it

    try:
        items = parse_many(text)
    except ValueError:
        raise ConfigurationError(
            f"{what}: cannot read {text!r} as a rate; write it like {_EXAMPLES}"
        ) from None
    if len(items) != 1:
        raise ConfigurationError(
            f"{what}: {text!r} names {len(items)} rates; give one, such as '50k/min'"
        )
    return float(items[0].amount), float(items[0].get_expiry())


def per_minute(value: float | str, what: str = "rate") -> float:
    """``"50000/minute"`` -> 50000.0, ``"1M/hour"`` -> 16666.7; numbers are per minute."""
    return _per(value, 60.0, what)


def per_second(value: float | str, what: str = "rate") -> float:
    """``"10/second"`` -> 10.0, ``"2.5k/min"`` -> 41.7; numbers are per second."""
    return _per(value, 1.0, what)
