"""Containment: a token bucket per caller (docs/design.md, "Token bucket").

A bucket holds up to ``capacity`` and refills continuously at ``rate`` per second; a call takes
``cost``. A new caller starts with a full bucket, so an idle caller may burst up to capacity,
while the long-run rate can never exceed ``rate``.

**Near-limit episodes.** A calendar minute is *hot* once the caller has been admitted at least
``near_limit_fraction`` (80 %) of what the refill allows in a minute. When a run of consecutive
hot minutes has lasted more than ``near_limit_after`` seconds (5 minutes), the verdict carries
``near_limit=True`` once; the episode ends, and the alert re-arms, at the first minute that is
not hot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._errors import ConfigurationError
from .rates import per_second

__all__ = [
    "FREE",
    "FULL",
    "GROWTH",
    "STARTER",
    "BucketPolicy",
    "BucketState",
    "BucketVerdict",
    "consume",
    "give_back",
    "level",
    "limits_of",
    "new_state",
    "take_more",
]

_MINUTE = 60.0

# Timestamps near 1.7e9 carry ~2e-7 s of float resolution, so a caller that waits exactly
# ``retry_after`` may find a millionth of a token missing; forgive that much.
_EPSILON = 1e-6

#: ``tokens`` value of a bucket that is full whatever its capacity (after reset or a live change).
FULL = -1.0


@dataclass(frozen=True, slots=True, init=False)
class BucketPolicy:
    """Capacity and refill of a caller's bucket.

    Attributes:
        rate: refill per second; a number, or a rate string (``"10/second"``, ``"600/min"``).
        capacity: the most a bucket holds: the burst an idle caller may spend at once.
        near_limit_fraction: share of the refill rate that counts as near the limit (0.8).
        near_limit_after: seconds of continuous near-limit use before the alert fires (300).

    >>> BucketPolicy(rate="600/min", capacity=50).rate
    10.0
    """

    rate: float
    capacity: float
    near_limit_fraction: float
    near_limit_after: float

    def __init__(
        self,
        *,
        rate: float | str,
        capacity: float,
        near_limit_fraction: float = 0.8,
        near_limit_after: float = 300.0,
    ) -> None:
        put = object.__setattr__
        refill = per_second(rate, "rate")
        if refill <= 0:
            raise ConfigurationError(f"bucket rate must be positive, not {rate!r}")
        if not (isinstance(capacity, (int, float)) and math.isfinite(capacity) and capacity > 0):
            raise ConfigurationError(f"bucket capacity must be a positive number, not {capacity!r}")
        if not 0 < near_limit_fraction <= 1:
            raise ConfigurationError("near_limit_fraction must be in (0, 1]")
        put(self, "rate", refill)
        put(self, "capacity", float(capacity))
        put(self, "near_limit_fraction", float(near_limit_fraction))
        put(self, "near_limit_after", float(near_limit_after))


#: Tier presets: refill in calls per second, burst capacity.
FREE = BucketPolicy(rate=10, capacity=50)
STARTER = BucketPolicy(rate=50, capacity=200)
GROWTH = BucketPolicy(rate=100, capacity=500)


@dataclass(slots=True)
class BucketState:
    tokens: float
    updated: float
    use_minute: int = -1  # calendar minute whose admitted cost is in use_amount
    use_amount: float = 0.0
    hot_since: int = -1  # first minute of the current hot run, -1 when none
    alerted: bool = False  # the alert of the current episode has fired
    capacity_override: float = -1.0  # -1: none; set live via Fuse.set_bucket
    rate_override: float = -1.0


# Not frozen: built on every guarded call, and frozen dataclasses pay a setattr per field.
@dataclass(slots=True)
class BucketVerdict:
    allowed: bool
    remaining: float  # tokens left after this call
    capacity: float
    rate: float  # refill per second
    retry_after: float  # 0 when allowed; else seconds until ``cost`` is available
    near_limit: bool = False  # this call fired the episode's near-limit alert


def new_state(now: float, params: BucketPolicy) -> BucketState:
    return BucketState(tokens=params.capacity, updated=now)


def limits_of(state: BucketState, params: BucketPolicy) -> tuple[float, float]:
    """(capacity, rate) in force: a live override wins over the code's policy."""
    capacity = state.capacity_override if state.capacity_override > 0.0 else params.capacity
    rate = state.rate_override if state.rate_override > 0.0 else params.rate
    return capacity, rate


def level(state: BucketState, now: float, capacity: float, rate: float) -> float:
    """Tokens available at ``now``, refilled since the last update (never above capacity)."""
    if state.tokens < 0.0:
        return capacity
    elapsed = max(now - state.updated, 0.0)
    return min(capacity, state.tokens + elapsed * rate)


def _track_use(
    state: BucketState, cost: float, now: float, rate: float, params: BucketPolicy
) -> bool:
    minute = math.floor(now / _MINUTE)
    if minute > state.use_minute:
        hot = state.use_amount >= params.near_limit_fraction * rate * _MINUTE
        if not (hot and minute == state.use_minute + 1):
            state.hot_since = -1
            state.alerted = False
        state.use_minute = minute
        state.use_amount = 0.0
    state.use_amount += cost
    if state.use_amount < params.near_limit_fraction * rate * _MINUTE:
        return False
    if state.hot_since < 0:
        state.hot_since = state.use_minute
    long_enough = (state.use_minute - state.hot_since) * _MINUTE >= params.near_limit_after
    if long_enough and not state.alerted:
        state.alerted = True
        return True
    return False


def consume(state: BucketState, cost: float, now: float, params: BucketPolicy) -> BucketVerdict:
    """Take ``cost`` if the bucket has it; else say how long until it will."""
    capacity, rate = limits_of(state, params)
    tokens = level(state, now, capacity, rate)
    state.updated = max(now, state.updated)
    if tokens < cost - _EPSILON:
        state.tokens = tokens
        return BucketVerdict(
            allowed=False,
            remaining=tokens,
            capacity=capacity,
            rate=rate,
            retry_after=(cost - tokens) / rate,
        )
    state.tokens = max(tokens - cost, 0.0)
    near_limit = _track_use(state, cost, now, rate, params)
    return BucketVerdict(
        allowed=True,
        remaining=state.tokens,
        capacity=capacity,
        rate=rate,
        retry_after=0.0,
        near_limit=near_limit,
    )


# -- leases (lease.py): tokens taken ahead of the calls that spend them, and given back --------


def take_more(state: BucketState, want: float, now: float, params: BucketPolicy) -> float:
    """Right after a ``consume`` that allowed a call at ``now``: take up to ``want`` more (what
    the bucket holds, no more) for a lease; returns what was taken. Counted as used, like
    admitted cost, for the near-limit episodes (a ``give_back`` uncounts what comes back)."""
    taken = min(want, state.tokens)
    if taken <= 0.0:
        return 0.0
    state.tokens = max(state.tokens - taken, 0.0)
    state.use_amount += taken
    return taken


def give_back(state: BucketState, tokens: float, now: float, params: BucketPolicy) -> None:
    """Return ``tokens`` a lease took and did not spend: the bucket refills by them, never
    above its capacity (tokens that come back to a full bucket are lost, never over-admitted)."""
    capacity, rate = limits_of(state, params)
    current = level(state, now, capacity, rate)
    state.updated = max(now, state.updated)
    state.tokens = min(capacity, current + tokens)
    if state.use_minute == math.floor(now / _MINUTE):
        state.use_amount = max(state.use_amount - tokens, 0.0)
