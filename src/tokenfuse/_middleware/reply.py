"""Inbound: what the middleware answers — ``Reply``, and the ``RateLimit`` / ``Retry-After``
headers it adds to every guarded response.

The headers follow draft-ietf-httpapi-ratelimit-headers-11 (May 2026), structured-field form,
describing the caller's token bucket as a quota of ``capacity`` per the time it takes to
refill from empty::

    RateLimit-Policy: "default";q=50;w=5
    RateLimit: "default";r=12;t=4

``r`` is the whole calls left in the bucket; on allowed responses ``t`` is the seconds until
it is full again. On a refusal ``t`` equals ``Retry-After`` (the seconds until a call can
pass), so ``Retry-After`` never points before the end of the effective window (section 6 of
the draft); while a velocity latch is open, ``r=0``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from .._errors import FuseTripped, StoreUnavailable
from .._throttle import Throttle

__all__ = [
    "Headers",
    "Reply",
    "delay_seconds",
    "error_fields",
    "log_failing_closed",
    "rate_limit_headers",
    "refused",
    "unavailable",
]

Headers = tuple[tuple[str, str], ...]

logger = logging.getLogger("tokenfuse.middleware")

_MAX_SECONDS = 1_000_000_000  # Retry-After / t cap: an absurd cost must not print 300 digits
_MAX_INTEGER = 999_999_999_999_999  # largest structured-field Integer


@dataclass(frozen=True, slots=True)
class Reply:
    """A complete response the middleware sends instead of calling the app.

    >>> Reply.json({"error": "slow down"}).status
    429
    """

    status: int
    headers: Headers
    body: bytes

    @classmethod
    def json(
        cls, data: object, *, status: int = 429, headers: Iterable[tuple[str, str]] = ()
    ) -> Reply:
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
        return cls(status, (("Content-Type", "application/json"), *headers), body)

    def with_defaults(self, headers: Headers) -> Reply:
        """This reply plus each of ``headers`` it does not set itself (any case).

        >>> Reply.json({}).with_defaults((("Retry-After", "3"),)).headers[-1]
        ('Retry-After', '3')
        """
        present = {name.lower() for name, _ in self.headers}
        extra = tuple(item for item in headers if item[0].lower() not in present)
        return Reply(self.status, (*self.headers, *extra), self.body)


def delay_seconds(value: float) -> int:
    """Delay-seconds for headers: whole seconds, rounded up, at least 1.

    >>> delay_seconds(0.2), delay_seconds(4.01)
    (1, 5)
    """
    if not math.isfinite(value) or value >= _MAX_SECONDS:
        return _MAX_SECONDS
    return max(1, math.ceil(value))


def _integer(value: float) -> int:
    if not math.isfinite(value):
        return _MAX_INTEGER if value > 0 else 0
    return min(max(math.floor(value), 0), _MAX_INTEGER)


@lru_cache(maxsize=256)
def _policy(name: str, capacity: float, rate: float) -> str:
    """The ``RateLimit-Policy`` value: the same for every response of a tier."""
    return f'"{name}";q={_integer(capacity)};w={delay_seconds(capacity / rate)}'


def rate_limit_headers(
    name: str, capacity: float, rate: float, remaining: float, window: int
) -> Headers:
    """``RateLimit-Policy`` and ``RateLimit`` for a bucket of ``capacity`` refilled at ``rate``.

    >>> rate_limit_headers("default", 50, 10, 12.5, 4)[1]
    ('RateLimit', '"default";r=12;t=4')
    """
    return (
        ("RateLimit-Policy", _policy(name, capacity, rate)),
        ("RateLimit", f'"{name}";r={_integer(remaining)};t={window}'),
    )


def _json_number(value: object) -> object:
    if isinstance(value, float):
        return round(value, 3) if math.isfinite(value) else None
    return value


def error_fields(error: FuseTripped | StoreUnavailable) -> dict[str, object]:
    """What a refusal says, JSON-ready: the error's fields (``type``, ``message``, ...) or,
    for a store that is down, a generic ``store_unavailable`` with a retry in 1 s."""
    if isinstance(error, StoreUnavailable):
        message = "the rate limiter cannot decide right now; retry shortly"
        return {"type": "store_unavailable", "message": message, "retry_after": 1}
    return {name: _json_number(value) for name, value in error.as_dict().items()}


def refused(error: FuseTripped, headers: Headers) -> Reply:
    """The default refusal: 429 with the error's fields as JSON (``type``, ``message``, ...)."""
    return Reply.json(error_fields(error), status=429, headers=headers)


_unavailable_log = Throttle(1.0)  # a dead store fails every request: one line a second


def unavailable(exc: StoreUnavailable) -> Reply:
    """The store is down and the fuse fails closed: 503, never a 500. The body is generic:
    the store's error names hosts and ports, which is for the log only."""
    log_failing_closed(exc, "503")
    return Reply.json(error_fields(exc), status=503, headers=(("Retry-After", "1"),))


def log_failing_closed(exc: StoreUnavailable, answer: str) -> None:
    """The detail of a dead store, for the log: one line a second at most."""
    held = _unavailable_log.take()
    if held is not None:
        more = f"; {held} more held back" if held else ""
        logger.warning("tokenfuse: failing closed with %s: %s%s", answer, exc, more)
