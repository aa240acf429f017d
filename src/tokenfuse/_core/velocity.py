"""Velocity: the amount a key spends in a sliding 60 s window, judged against its own normal.

docs/design.md explains each rule: "Decision order", "Baseline estimator" and "Latch".

**Window.** Thirteen 5-second slots in a ring: the twelve newest count fully and the oldest
counts for the part of it still inside the last 60 s. Each slot also keeps its largest single
amount, so a spike can be tested with the window's largest call left out.

**Decision**, in order: the manual ceiling (``rate > limit``); once the baseline is
established and meaningful, the spike (``rate >= spike_multiple x baseline``, still without
the largest call); until then, the cold-start ceiling (``rate > cold_start_limit``).

**Baseline.** The exponentially time-weighted mean of the key's *active* minutes, updated in
O(1) as ``weight = weight·d + 1; baseline += (x - baseline) / weight``. A completed minute
waits one minute as *pending*; a minute in which the key tripped or was open is never learned,
nor is the minute before it.

**Latch.** A trip opens the key for ``cooldown`` seconds, doubling for each further trip within
``escalation_window`` of the previous one, capped at ``cooldown_max``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .._errors import ConfigurationError
from .rates import per_minute

__all__ = [
    "REASON_CODES",
    "SLOTS",
    "SLOT_SECONDS",
    "VelocityPolicy",
    "VelocityState",
    "VelocityVerdict",
    "established",
    "gate",
    "manual_ceiling",
    "new_state",
    "rate_at",
    "record",
    "reset",
]

WINDOW_SECONDS = 60.0
SLOT_SECONDS = 5.0
SLOTS = 13  # 60 / 5 full slots plus the oldest one, which the window covers only in part
_LN2 = math.log(2.0)

# Stored as small integers (in Redis too); the names are what users see.
REASON_CODES = {1: "manual_ceiling", 2: "loop_suspected", 3: "cold_start_ceiling"}
_MANUAL, _LOOP, _COLD = 1, 2, 3


def _optional_rate(value: float | str | None, what: str) -> float | None:
    return None if value is None else per_minute(value, what)


def _positive(value: float, what: str) -> float:
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ConfigurationError(f"{what} must be a positive number, not {value!r}")
    return number


@dataclass(frozen=True, slots=True, init=False)
class VelocityPolicy:
    """How a fuse judges the rate of one kind of amount (tokens, calls, dollars).

    Rates are numbers per minute or rate strings (``"50000/minute"``, ``"50k/min"``,
    ``"1M/hour"``); times are seconds. Every default is the one documented here.

    Attributes:
        limit: manual ceiling per minute, ``None`` for none; a live override per key wins.
        spike_multiple: a rate this many times the established baseline is a loop (10).
        min_baseline: baselines below this per minute are too small to spike-check (100).
        learning_period: how long since a key was first seen before its baseline can be
            established (3 days).
        min_samples: learned active minutes needed before the baseline counts (60).
        cold_start_limit: ceiling per minute while the spike check is not armed (100,000).
        half_life: after this long, a learned minute weighs half as much (1 day).
        cooldown: how long a trip keeps the key open (60 s).
        cooldown_max: the cap on an escalated cooldown (3,600 s).
        escalation_window: a trip within this long of the previous one doubles the
            cooldown (3,600 s).
        unit: what the amounts are, for messages: ``tokens``, ``calls``, ...

    >>> VelocityPolicy(limit="50k/min").limit
    50000.0
    """

    limit: float | None
    spike_multiple: float
    min_baseline: float
    learning_period: float
    min_samples: int
    cold_start_limit: float | None
    half_life: float
    cooldown: float
    cooldown_max: float
    escalation_window: float
    unit: str

    def __init__(
        self,
        *,
        limit: float | str | None = None,
        spike_multiple: float = 10.0,
        min_baseline: float | str = 100.0,
        learning_period: float = 3 * 86_400.0,
        min_samples: int = 60,
        cold_start_limit: float | str | None = 100_000.0,
        half_life: float = 86_400.0,
        cooldown: float = 60.0,
        cooldown_max: float = 3_600.0,
        escalation_window: float = 3_600.0,
        unit: str = "tokens",
    ) -> None:
        put = object.__setattr__
        put(self, "limit", _optional_rate(limit, "limit"))
        put(self, "spike_multiple", _positive(spike_multiple, "spike_multiple"))
        put(self, "min_baseline", per_minute(min_baseline, "min_baseline"))
        if learning_period < 0 or min_samples < 0:
            raise ConfigurationError("learning_period and min_samples must not be negative")
        put(self, "learning_period", float(learning_period))
        put(self, "min_samples", int(min_samples))
        put(self, "cold_start_limit", _optional_rate(cold_start_limit, "cold_start_limit"))
        put(self, "half_life", _positive(half_life, "half_life"))
        put(self, "cooldown", _positive(cooldown, "cooldown"))
        put(self, "cooldown_max", max(_positive(cooldown_max, "cooldown_max"), self.cooldown))
        put(self, "escalation_window", float(escalation_window))
        put(self, "unit", str(unit))


@dataclass(slots=True)
class VelocityState:
    """Everything a store keeps for one key: a fixed number of fields, whatever the traffic."""

    first_seen: float
    head: int = -1  # absolute index of the newest slot written
    amounts: list[float] = field(default_factory=lambda: [0.0] * SLOTS)
    largest: list[float] = field(default_factory=lambda: [0.0] * SLOTS)
    minute: int = -1  # calendar minute being accumulated
    minute_amount: float = 0.0
    pending_minute: int = -1  # completed minute waiting one minute before it is learned
    pending_amount: float = 0.0
    baseline: float = 0.0
    weight: float = 0.0  # decayed sum of learned minutes' weights
    samples: int = 0  # learned minutes, not decayed
    learned_at: float = 0.0
    open_until: float = 0.0
    strikes: int = 0  # trips in the current escalation run
    last_trip: float = 0.0
    trip_reason: int = 0
    trip_rate: float = 0.0
    trip_limit: float = 0.0
    trip_baseline: float = -1.0  # -1: no baseline was established at the trip
    limit_override: float = -1.0  # -1: none; set live via Fuse.set_limit


# Not frozen: built on every guarded call, and frozen dataclasses pay a setattr per field.
@dataclass(slots=True)
class VelocityVerdict:
    """What one gate or record concluded. ``rate`` is the last 60 s, in ``unit``/min."""

    allowed: bool
    tripped: bool = False  # this very call opened the key
    reason: str | None = None  # set whenever ``allowed`` is False
    rate: float = 0.0
    limit: float | None = None  # the threshold that applies (or was crossed)
    baseline: float | None = None  # None unless established
    multiple: float | None = None
    retry_after: float = 0.0


def _advance(state: VelocityState, now: float) -> int:
    """Move the ring to the slot of ``now``, zeroing slots that fell out of the window."""
    slot = math.floor(now / SLOT_SECONDS)
    if slot > state.head:
        for index in range(max(state.head + 1, slot - SLOTS + 1), slot + 1):
            state.amounts[index % SLOTS] = 0.0
            state.largest[index % SLOTS] = 0.0
        state.head = slot
    return state.head  # a clock that stepped back writes into the newest slot


def _window(state: VelocityState, now: float) -> tuple[float, float]:
    """(amount in the last 60 s, largest single amount among the slots that count).

    Every slot in the ring lies inside the window (``_advance`` zeroed the rest); the oldest
    counts only for the part of it the window still covers.
    """
    oldest = (state.head + 1) % SLOTS
    elapsed = min(max((now - state.head * SLOT_SECONDS) / SLOT_SECONDS, 0.0), 1.0)
    total = 0.0
    for amount in state.amounts:  # not sum(): Python 3.12 compensates, Lua adds plainly
        total += amount
    return total - state.amounts[oldest] * elapsed, max(state.largest)


def _learn(state: VelocityState, amount: float, at: float, params: VelocityPolicy) -> None:
    if state.weight > 0.0:
        decay = math.exp(-(at - state.learned_at) * _LN2 / params.half_life)
        state.weight = state.weight * decay + 1.0
    else:
        state.weight = 1.0
    state.baseline += (amount - state.baseline) / state.weight
    state.samples += 1
    state.learned_at = at


def _roll_minute(state: VelocityState, now: float, params: VelocityPolicy) -> None:
    """Close the accumulating minute if ``now`` is past it; learn the pending one if clean."""
    minute = math.floor(now / WINDOW_SECONDS)
    if minute <= state.minute:
        return
    if state.minute >= 0 and state.minute_amount > 0.0:
        # The latch was open at some point of the minute (a trip in it, or still open from
        # one before): its traffic is not normal, and neither was the minute just before it.
        tainted = state.open_until > state.minute * WINDOW_SECONDS
        if state.pending_minute >= 0 and not (tainted and state.pending_minute == state.minute - 1):
            _learn(state, state.pending_amount, (state.pending_minute + 1) * WINDOW_SECONDS, params)
        state.pending_minute = -1 if tainted else state.minute
        state.pending_amount = 0.0 if tainted else state.minute_amount
    state.minute = minute
    state.minute_amount = 0.0


def established(state: VelocityState, now: float, params: VelocityPolicy) -> bool:
    """Whether the key's baseline counts: first seen ``learning_period`` ago, with at least
    ``min_samples`` learned minutes."""
    return now - state.first_seen >= params.learning_period and state.samples >= params.min_samples


def _baseline(state: VelocityState, now: float, params: VelocityPolicy) -> float | None:
    return state.baseline if established(state, now, params) else None


def manual_ceiling(state: VelocityState, params: VelocityPolicy) -> float | None:
    """The manual ceiling in force: the key's live override, else the policy's limit."""
    return state.limit_override if state.limit_override >= 0.0 else params.limit


def _refusal(state: VelocityState, now: float, *, tripped: bool) -> VelocityVerdict:
    baseline = state.trip_baseline if state.trip_baseline >= 0.0 else None
    multiple = state.trip_rate / baseline if baseline and state.trip_reason == _LOOP else None
    return VelocityVerdict(
        allowed=False,
        tripped=tripped,
        reason=REASON_CODES[state.trip_reason],
        rate=state.trip_rate,
        limit=state.trip_limit,
        baseline=baseline,
        multiple=multiple,
        retry_after=state.open_until - now,
    )


def _judge(
    state: VelocityState, rate: float, largest: float, now: float, params: VelocityPolicy
) -> tuple[int, float | None, float | None]:
    """(reason code or 0, the limit that applies, the established baseline)."""
    baseline = _baseline(state, now, params)
    ceiling = manual_ceiling(state, params)
    if ceiling is not None and rate > ceiling:
        return _MANUAL, ceiling, baseline
    if baseline is not None and baseline >= params.min_baseline:
        threshold = params.spike_multiple * baseline
        if rate >= threshold and rate - largest >= threshold:
            return _LOOP, threshold, baseline
        return 0, threshold, baseline
    cold = params.cold_start_limit
    if cold is not None and rate > cold:
        return _COLD, cold, baseline
    return 0, cold if ceiling is None else ceiling, baseline


def _trip(
    state: VelocityState, reason: int, rate: float, limit: float, baseline: float | None,
    now: float, params: VelocityPolicy,
) -> None:  # fmt: skip
    recent = state.strikes > 0 and now - state.last_trip <= params.escalation_window
    state.strikes = state.strikes + 1 if recent else 1
    cooldown = min(params.cooldown * 2.0 ** (state.strikes - 1), params.cooldown_max)
    state.open_until = now + cooldown
    state.last_trip = now
    state.trip_reason = reason
    state.trip_rate = rate
    state.trip_limit = limit
    state.trip_baseline = -1.0 if baseline is None else baseline


def new_state(now: float) -> VelocityState:
    return VelocityState(first_seen=now)


def gate(state: VelocityState, now: float) -> VelocityVerdict:
    """Is the key open? Read-only: a refused call spends nothing and records nothing."""
    if state.open_until > now:
        return _refusal(state, now, tripped=False)
    return VelocityVerdict(allowed=True)


def record(
    state: VelocityState, amount: float, now: float, params: VelocityPolicy
) -> VelocityVerdict:
    """Add ``amount`` at ``now`` and judge the new rate; a trip opens the key.

    Amounts recorded while the key is open still count (they were paid for by calls that
    passed the gate before the trip) but cannot trip it again.
    """
    _roll_minute(state, now, params)
    slot = _advance(state, now) % SLOTS
    state.amounts[slot] += amount
    state.largest[slot] = max(state.largest[slot], amount)
    state.minute_amount += amount
    if state.open_until > now:
        return _refusal(state, now, tripped=False)
    rate, largest = _window(state, now)
    reason, limit, baseline = _judge(state, rate, largest, now, params)
    if reason and limit is not None:
        _trip(state, reason, rate, limit, baseline, now, params)
        return _refusal(state, now, tripped=True)
    return VelocityVerdict(
        allowed=True,
        rate=rate,
        limit=limit,
        baseline=baseline,
        multiple=rate / baseline if baseline else None,
    )


def reset(state: VelocityState) -> None:
    """Close the key at once and forget its window and escalation; keep what it learned."""
    state.open_until = 0.0
    state.strikes = 0
    state.head = -1
    state.amounts = [0.0] * SLOTS
    state.largest = [0.0] * SLOTS


def rate_at(state: VelocityState, now: float) -> float:
    """The rate over the 60 s before ``now``, read without moving the key's ring (for status)."""
    if state.head < 0 or math.floor(now / SLOT_SECONDS) - state.head >= SLOTS:
        return 0.0  # nothing recorded, or all of it older than the window
    probe = VelocityState(
        first_seen=state.first_seen,
        head=state.head,
        amounts=list(state.amounts),
        largest=list(state.largest),
    )
    _advance(probe, now)
    rate, _ = _window(probe, now)
    return rate
