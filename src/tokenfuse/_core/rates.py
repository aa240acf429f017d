"""Rates written the way ``limits`` and slowapi users already write them: ``"50000/minute"``."""

from __future__ import annotations

import math

from .._errors import ConfigurationError

__all__ = ["per_minute", "per_second"]


def _per(value: float | str, seconds: float, what: str) -> float:
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be a number or a rate string, not {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        number = _parse(value, seconds, what)
    else:
        raise ConfigurationError(f"{what} must be a number or a rate string, not {value!r}")
    if not math.isfinite(number) or number < 0:
        raise ConfigurationError(f"{what} must be a finite, non-negative rate, not {value!r}")
    return number


def _parse(text: str, seconds: float, what: str) -> float:
    from limits import parse_many  # imported lazily: only configuration pays for it

    try:
        items = parse_many(text)
    except ValueError as exc:
        raise ConfigurationError(f"{what}: cannot parse rate {text!r} ({exc})") from exc
    if len(items) != 1:
        raise ConfigurationError(f"{what}: expected one rate such as '50000/minute', got {text!r}")
    item = items[0]
    return float(item.amount) * seconds / float(item.get_expiry())


def per_minute(value: float | str, what: str = "rate") -> float:
    """``"50000/minute"`` -> 50000.0, ``"100/second"`` -> 6000.0; numbers are per minute."""
    return _per(value, 60.0, what)


def per_second(value: float | str, what: str = "rate") -> float:
    """``"10/second"`` -> 10.0, ``"600/minute"`` -> 10.0; numbers are per second."""
    return _per(value, 1.0, what)
