"""Velocity: what a key spends, judged against its own normal on several time scales.

``docs/detection.md`` explains every rule, the estimator and the defaults with the replays
that chose them; this module is their definition (``_stores/lua/_lib.lua`` is its twin).

**Windows.** The last 60 s: thirteen 5-second slots (the oldest counted for the part still
inside the window), each with its amount and its largest single call. The last 10 minutes
(the *long* window): eleven calendar-minute slots, each with its amount, largest call and
number of calls. State stays a fixed size whatever the traffic.

**Decision** on every record, the first rule that fires wins:

1. ``manual_ceiling``: the 60 s rate is above the limit (a live per-key override wins).
2. Once the baseline ``B`` is *established* (first seen ``learning_period`` ago, ``min_samples``
   learned minutes) and *meaningful* (``>= min_baseline``), with ``N = max(B, the hour's
   forgiven allowance, rms_share x the root mean square of the learned minutes)``:

   - ``loop_suspected``: the 60 s rate is ``>= spike_multiple x N``, with and without the
     window's largest call (a single large call is not a loop);
   - ``loop_sparse``: only the largest call holds the rate up, but together with the previous
     call excused that way it still runs at ``spike_multiple x N`` over the time between them;
   - ``loop_early``: a leaky bucket, filled by each call (as a share of the key's typical
     call, at most one) and drained at ``spike_multiple`` times the key's usual call rate,
     holds ``early_threshold`` calls (Page's CUSUM test, tuned so its drift is zero exactly
     at the spike multiple);
   - ``loop_sustained``: the 10-minute rate without its largest call is ``>=
     max(sustained_multiple x A, sustained_baseline_multiple x N)``, ``A`` the key's average
     per minute *idle time included*;
   - ``baseline_ceiling``: the 60 s rate is above ``max(cold_start_limit, ceiling_multiple x
     N)`` (only with a cold-start limit and no live per-key limit).

3. Otherwise (cold start), unless a live per-key limit is set, the same rules against what
   the key has shown ``S`` (its ``N`` once ``cold_start_samples`` minutes are learned, or what
   an operator forgave), never below the cold-start limits: ``cold_start_ceiling`` when the 60 s
   rate without its largest call is above ``max(cold_start_limit, spike_multiple x S)`` or
   with it above ``max(cold_start_limit, ceiling_multiple x S, 10 x cold_start_sustained)``
   (a minute may spend the ten minutes' budget); ``cold_start_budget`` when the 10-minute
   rate without its largest call is above ``max(cold_start_sustained,
   sustained_baseline_multiple x S)``.

**Baseline estimator.** The exponentially time-weighted mean of the key's *active* calendar
minutes: ``weight = weight·2^(-Δt/half_life) + 1; baseline += (x - baseline) / weight``. A
minute is learned when it leaves the long window (ten minutes late), unless a trip discarded
it: a trip discards every minute still in the window and every minute until the key closes
again, because a loop starts before the rule that catches it fires. Once ``min_samples`` are
learned, a minute counts for at most ``learn_clip x`` the baseline, so a loop below every
threshold raises it only slowly. The calls per active minute and the mean square of the
minutes are learned alongside. The average with idle time (``A``) follows from the same
weights in closed form.

**Teaching.** ``forgive`` reopens the key and records the last trip's rate as normal for its
hour of day (UTC) and the next: 24 one-byte allowances, on a log scale.

**Latch.** A trip opens the key for ``cooldown`` seconds, doubling for each further trip that
comes within ``escalation_window`` of the previous one, capped at ``cooldown_max``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from .._errors import ConfigurationError
from .rates import per_minute

__all__ = [
    "LONG_SLOTS",
    "PROFILE_WORDS",
    "REASON_CODES",
    "SLOTS",
    "SLOT_SECONDS",
    "VelocityPolicy",
    "VelocityState",
    "VelocityVerdict",
    "as_of",
    "established",
    "forgive",
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
MINUTE = 60.0
LONG_WINDOW = 600.0
LONG_SLOTS = 11  # ten full minutes plus the oldest one
HOUR = 3_600.0
PROFILE_WORDS = 4  # 24 hourly allowances of one byte, six to a double (integers < 2^48)
_LN2 = math.log(2.0)

# Stored as small integers (in Redis too); the names are what users see.
REASON_CODES = {
    1: "manual_ceiling",
    2: "loop_suspected",
    3: "cold_start_ceiling",
    4: "loop_sparse",
    5: "loop_early",
    6: "loop_sustained",
    7: "baseline_ceiling",
    8: "cold_start_budget",
}
_MANUAL, _LOOP, _COLD, _SPARSE, _EARLY, _SUSTAINED, _TOP, _BUDGET = range(1, 9)
_RELATIVE = frozenset({_LOOP, _SPARSE, _EARLY, _SUSTAINED, _TOP})  # judged against a baseline


def _optional_rate(value: float | str | None, what: str) -> float | None:
    return None if value is None else per_minute(value, what)


def _positive(value: float, what: str) -> float:
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ConfigurationError(f"{what} must be a positive number, not {value!r}")
    return number


def _optional_positive(value: float | None, what: str) -> float | None:
    return None if value is None else _positive(value, what)


@dataclass(frozen=True, slots=True, init=False)
class VelocityPolicy:
    """How a fuse judges the rate of one kind of amount (tokens, calls, dollars).

    Rates are numbers per minute or rate strings (``"50000/minute"``, ``"50k/min"``,
    ``"1M/hour"``); times are seconds. Every default is the one documented here and, with
    the replays that chose it, in docs/detection.md.

    Attributes:
        limit: manual ceiling per minute, ``None`` for none; a live override per key wins
            and also replaces the cold-start limits for that key.
        spike_multiple: a 60 s rate this many times the established baseline is a loop (10).
        min_baseline: baselines below this per minute are too small to judge against (100).
        learning_period: how long since a key was first seen before its baseline can be
            established (3 days).
        min_samples: learned active minutes needed before the baseline counts (60).
        cold_start_limit: ceiling per minute over 60 s until the baseline is established
            (100,000), raised by what the key has shown.
        cold_start_sustained: ceiling per minute over 10 minutes until then, the largest
            call left out (``"auto"``: 60 % of ``cold_start_limit``, 60,000, about 3.6M
            tokens an hour); one call may be as large as ten minutes of it.
        half_life: after this long, a learned minute weighs half as much (1 day).
        sustained_multiple: a 10-minute rate this many times the key's average, idle time
            included, is a loop (7.5)...
        sustained_baseline_multiple: ...as long as it is also this many times the baseline
            of active minutes (6).
        early_threshold: calls beyond the spike multiple's pace before the early check trips
            (12); ``None`` turns the early check off.
        ceiling_multiple: an established key's own ceiling per minute, times its baseline,
            never below ``cold_start_limit`` (100); ``None`` for none.
        learn_clip: a learned minute counts for at most this many times the baseline (8).
        rms_share: a key's normal minute is at least this share of the root mean square of
            its learned minutes (0.9), so that a bursty key is judged against its typical
            busy minute, not only its mean; ``None`` for the mean alone.
        cold_start_samples: learned minutes after which a key's cold-start ceilings follow
            what it has shown (20).
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
    cold_start_sustained: float | None
    half_life: float
    sustained_multiple: float
    sustained_baseline_multiple: float
    early_threshold: float | None
    ceiling_multiple: float | None
    learn_clip: float
    rms_share: float | None
    cold_start_samples: int
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
        cold_start_sustained: float | str | None = "auto",
        half_life: float = 86_400.0,
        sustained_multiple: float = 7.5,
        sustained_baseline_multiple: float = 6.0,
        early_threshold: float | None = 12.0,
        ceiling_multiple: float | None = 100.0,
        learn_clip: float = 8.0,
        rms_share: float | None = 0.9,
        cold_start_samples: int = 20,
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
        cold = _optional_rate(cold_start_limit, "cold_start_limit")
        put(self, "cold_start_limit", cold)
        if cold_start_sustained == "auto":  # 60 % of the cold-start ceiling, if there is one
            sustained = None if cold is None else 0.6 * cold
        else:
            sustained = _optional_rate(cold_start_sustained, "cold_start_sustained")
        put(self, "cold_start_sustained", sustained)
        put(self, "half_life", _positive(half_life, "half_life"))
        put(self, "sustained_multiple", _positive(sustained_multiple, "sustained_multiple"))
        put(
            self,
            "sustained_baseline_multiple",
            _positive(sustained_baseline_multiple, "sustained_baseline_multiple"),
        )
        put(self, "early_threshold", _optional_positive(early_threshold, "early_threshold"))
        put(self, "ceiling_multiple", _optional_positive(ceiling_multiple, "ceiling_multiple"))
        put(self, "learn_clip", _positive(learn_clip, "learn_clip"))
        put(self, "rms_share", _optional_positive(rms_share, "rms_share"))
        if cold_start_samples < 0:
            raise ConfigurationError("cold_start_samples must not be negative")
        put(self, "cold_start_samples", int(cold_start_samples))
        put(self, "cooldown", _positive(cooldown, "cooldown"))
        put(self, "cooldown_max", max(_positive(cooldown_max, "cooldown_max"), self.cooldown))
        put(self, "escalation_window", float(escalation_window))
        put(self, "unit", str(unit))


def _zeros(count: int) -> list[float]:
    return [0.0] * count


_EMPTY_SLOTS = (0.0,) * SLOTS


@dataclass(slots=True)
class VelocityState:
    """Everything a store keeps for one key: a fixed number of fields, whatever the traffic."""

    first_seen: float
    head: int = -1  # absolute index of the newest 5 s slot written
    amounts: list[float] = field(default_factory=lambda: _zeros(SLOTS))
    largest: list[float] = field(default_factory=lambda: _zeros(SLOTS))
    minute_head: int = -1  # calendar minute of the newest long-window slot
    minute_amounts: list[float] = field(default_factory=lambda: _zeros(LONG_SLOTS))
    minute_largest: list[float] = field(default_factory=lambda: _zeros(LONG_SLOTS))
    minute_calls: list[float] = field(default_factory=lambda: _zeros(LONG_SLOTS))
    baseline: float = 0.0  # per active minute
    calls: float = 0.0  # calls per active minute, learned with the baseline
    spread: float = 0.0  # mean square of the active minutes, learned with the baseline
    weight: float = 0.0  # decayed sum of learned minutes' weights
    samples: int = 0  # learned minutes, not decayed
    learned_at: float = 0.0
    discard_through: int = -1  # no minute up to this one is learned (a trip's run-up)
    open_until: float = 0.0
    strikes: int = 0  # trips in the current escalation run
    last_trip: float = 0.0
    trip_reason: int = 0
    trip_rate: float = 0.0
    trip_limit: float = 0.0
    trip_baseline: float = -1.0  # -1: no baseline was known at the trip
    trip_window: float = 0.0  # seconds the tripping rate was measured over
    early_level: float = 0.0  # the early check's bucket, in typical calls
    early_at: float = 0.0  # when it was last updated
    early_since: float = 0.0  # when it last started filling from empty
    early_amount: float = 0.0  # the amount recorded since then
    excused_slot: int = -1  # 5 s slot of the last large call excused from the spike rule
    excused_amount: float = 0.0
    profile: list[float] = field(default_factory=lambda: _zeros(PROFILE_WORDS))
    limit_override: float = -1.0  # -1: none; set live via Fuse.set_limit


# Not frozen: built on every guarded call, and frozen dataclasses pay a setattr per field.
@dataclass(slots=True)
class VelocityVerdict:
    """What one gate or record concluded. ``rate`` is per minute, in ``unit``: over the last
    60 s, or for a refusal over ``window`` seconds, the span the rule that fired measured."""

    allowed: bool
    tripped: bool = False  # this very call opened the key
    reason: str | None = None  # set whenever ``allowed`` is False
    rate: float = 0.0
    limit: float | None = None  # the threshold that applies (or was crossed)
    baseline: float | None = None  # the reference the rule judged against, if any
    multiple: float | None = None
    retry_after: float = 0.0
    window: float | None = None  # seconds; set on refusals


# -- windows ------------------------------------------------------------------------------------


def _advance(state: VelocityState, now: float) -> int:
    """Move the 60 s ring to the slot of ``now``, zeroing slots that fell out of the window."""
    slot = math.floor(now / SLOT_SECONDS)
    if slot > state.head:
        _advance_to(state, slot)
    return state.head  # a clock that stepped back writes into the newest slot


def _advance_to(state: VelocityState, slot: int) -> None:
    """``_advance`` to a later slot."""
    amounts, largest = state.amounts, state.largest
    if slot - state.head >= SLOTS:  # the whole window fell out (a key idle for a minute)
        amounts[:] = _EMPTY_SLOTS
        largest[:] = _EMPTY_SLOTS
    else:
        for index in range(state.head + 1, slot + 1):
            amounts[index % SLOTS] = 0.0
            largest[index % SLOTS] = 0.0
    state.head = slot


def _sliding_sum(values: list[float], head: int, now: float, seconds: float) -> float:
    """The amount of a ring whose newest slot is ``head`` (``seconds`` long), with the
    oldest slot counted only for the part of it the window still covers."""
    oldest = (head + 1) % len(values)
    elapsed = (now - head * seconds) / seconds  # clamped to [0, 1], as min(max(...)) would
    if elapsed < 0.0:
        elapsed = 0.0
    elif elapsed > 1.0:
        elapsed = 1.0
    total = 0.0
    for value in values:  # not sum(): Python 3.12 compensates, Lua adds plainly
        total += value
    return total - values[oldest] * elapsed


def _rate(state: VelocityState, now: float) -> float:
    """The amount in the last 60 s (``_advance`` moved the ring); its largest single call is
    ``max(state.largest)``, read only by the rules that need it."""
    return _sliding_sum(state.amounts, state.head, now, SLOT_SECONDS)


def _long_rate(state: VelocityState, now: float) -> float:
    """The rate per minute over the last 10 minutes (``_roll_minutes`` moved the ring)."""
    return _sliding_sum(state.minute_amounts, state.minute_head, now, MINUTE) * (
        MINUTE / LONG_WINDOW
    )


def _largest_slot(state: VelocityState) -> int:
    """Absolute index of the 5 s slot holding the 60 s window's largest call (the first of
    equals in ring order)."""
    best, ring = -1.0, 0
    for index in range(SLOTS):
        if state.largest[index] > best:
            best, ring = state.largest[index], index
    return state.head - (state.head - ring) % SLOTS


# -- learning -----------------------------------------------------------------------------------


def _learn(
    state: VelocityState, amount: float, calls: float, at: float, params: VelocityPolicy
) -> None:
    if state.samples >= params.min_samples:  # a known key: far above normal counts as clipped
        amount = min(amount, params.learn_clip * state.baseline)
        calls = min(calls, params.learn_clip * state.calls)
    if state.weight > 0.0:
        decay = math.exp(-(at - state.learned_at) * _LN2 / params.half_life)
        state.weight = state.weight * decay + 1.0
    else:
        state.weight = 1.0
    state.baseline += (amount - state.baseline) / state.weight
    state.calls += (calls - state.calls) / state.weight
    state.spread += (amount * amount - state.spread) / state.weight
    state.samples += 1
    state.learned_at = at


def _roll_minutes(state: VelocityState, now: float, params: VelocityPolicy) -> None:
    """Move the long ring to the minute of ``now``; learn each minute that leaves it."""
    minute = math.floor(now / MINUTE)
    head = state.minute_head
    if minute <= head:
        return
    for index in range(max(head - LONG_SLOTS + 1, 0), min(head, minute - LONG_SLOTS) + 1):
        ring = index % LONG_SLOTS
        amount = state.minute_amounts[ring]
        if amount > 0.0 and index > state.discard_through:
            calls = state.minute_calls[ring]
            _learn(state, amount, calls, (index + 1) * MINUTE, params)
        state.minute_amounts[ring] = 0.0
        state.minute_largest[ring] = 0.0
        state.minute_calls[ring] = 0.0
    state.minute_head = minute


def established(state: VelocityState, now: float, params: VelocityPolicy) -> bool:
    """Whether the key's baseline counts: first seen ``learning_period`` ago, with at least
    ``min_samples`` learned minutes."""
    return now - state.first_seen >= params.learning_period and state.samples >= params.min_samples


def _average(state: VelocityState, now: float, params: VelocityPolicy) -> float:
    """The key's amount per minute with idle minutes as zeros, on the baseline's weights:
    the learned minutes' weighted sum over the weight of every minute since first seen."""
    age = now - state.first_seen
    if state.weight <= 0.0 or age <= 0.0:
        return 0.0
    decay = math.exp(-(now - state.learned_at) * _LN2 / params.half_life)
    minutes = params.half_life / (MINUTE * _LN2) * (1.0 - math.exp(-age * _LN2 / params.half_life))
    return state.baseline * state.weight * decay / minutes


def _typical_peak(state: VelocityState, params: VelocityPolicy) -> float:
    """``rms_share`` of the root mean square of the key's learned minutes: a bursty key's
    normal minute, above its mean (a steady key's is about its mean); 0 when turned off."""
    share = params.rms_share
    return 0.0 if share is None else share * math.sqrt(state.spread)


def _allowance(state: VelocityState, now: float) -> float:
    """What an operator forgave at this hour of day (UTC), per minute; 0 if nothing."""
    hour = math.floor(now / HOUR) % 24
    word = state.profile[hour // 6]
    if word == 0.0:
        return 0.0
    code = math.floor(word / 2.0 ** (8 * (hour % 6))) % 256
    return 0.0 if code == 0 else 2.0 ** (code / 8.0)


def _teach(state: VelocityState, hour: int, rate: float) -> None:
    """Raise the hour's allowance to ``rate`` (rounded up to the next eighth of an octave)."""
    code = min(max(float(math.ceil(8.0 * math.log(rate) / _LN2)), 1.0), 255.0)
    place = 2.0 ** (8 * (hour % 6))
    word = state.profile[hour // 6]
    old = math.floor(word / place) % 256
    if code > old:
        state.profile[hour // 6] = word + (code - old) * place


# -- rules --------------------------------------------------------------------------------------

# (reason code or 0, rate per minute, threshold, reference baseline or None, window seconds)
_Finding = tuple[int, float, float | None, float | None, float]


def manual_ceiling(state: VelocityState, params: VelocityPolicy) -> float | None:
    """The manual ceiling in force: the key's live override, else the policy's limit."""
    return state.limit_override if state.limit_override >= 0.0 else params.limit


def _feed_early(
    state: VelocityState, amount: float, now: float, normal: float, params: VelocityPolicy
) -> None:
    """The early check's bucket: one typical call (at most) in, ``spike_multiple`` times the
    key's calls per minute (scaled to the hour's normal) out."""
    pace = params.spike_multiple * state.calls * (normal / state.baseline) / MINUTE
    elapsed = now - state.early_at
    level = state.early_level - pace * (elapsed if elapsed > 0.0 else 0.0)
    if not level > 0.0:  # empty: a new episode starts with this call
        level = 0.0
        state.early_since = now
        state.early_amount = 0.0
    share = amount * state.calls / state.baseline
    state.early_level = level + (share if share < 1.0 else 1.0)
    state.early_amount += amount
    state.early_at = now


def _sparse(state: VelocityState, largest: float, threshold: float) -> tuple[float, float] | None:
    """The window's largest call alone holds the spike: excuse it, unless the call excused
    before it, taken together with it, runs at the threshold over the time between them.
    Returns that (rate, span) when it does."""
    slot = _largest_slot(state)
    if slot == state.excused_slot and largest == state.excused_amount:
        return None  # the same call as before
    before, at = state.excused_amount, state.excused_slot
    state.excused_slot = slot
    state.excused_amount = largest
    if at < 0:
        return None
    span = max((slot - at) * SLOT_SECONDS, WINDOW_SECONDS)
    rate = (before + largest) * (WINDOW_SECONDS / span)
    return (rate, span) if rate >= threshold else None


def _established_rules(
    state: VelocityState, amount: float, rate: float, normal: float, now: float,
    params: VelocityPolicy,
) -> _Finding:  # fmt: skip
    """The rules of an established key, against its normal ``N`` at this hour."""
    threshold = params.spike_multiple * normal
    if rate >= threshold:
        largest = max(state.largest)
        if rate - largest >= threshold:
            return _LOOP, rate, threshold, normal, WINDOW_SECONDS
        sparse = _sparse(state, largest, threshold)
        if sparse is not None:
            return _SPARSE, sparse[0], threshold, normal, sparse[1]
    if params.early_threshold is not None and state.calls > 0.0:
        _feed_early(state, amount, now, normal, params)
        if state.early_level >= params.early_threshold:
            span = max(now - state.early_since, 1.0)  # a burst at one instant: over a second
            return _EARLY, state.early_amount * (WINDOW_SECONDS / span), threshold, normal, span
    # Sustained: the long rate without its largest call reaches both floors (tested one by
    # one, the costlier one only when the first is reached).
    long_rate = _long_rate(state, now)
    floor = params.sustained_baseline_multiple * normal
    if long_rate >= floor:
        steady = long_rate - max(state.minute_largest) * (MINUTE / LONG_WINDOW)
        average = _average(state, now, params)
        sustained = max(params.sustained_multiple * average, floor)
        if steady >= sustained:
            return _SUSTAINED, long_rate, sustained, average, LONG_WINDOW
    cold = params.cold_start_limit  # no cold-start ceiling, no ceiling of the key's own
    if cold is not None and params.ceiling_multiple is not None and state.limit_override < 0.0:
        top = max(params.ceiling_multiple * normal, cold)
        if rate > top:
            return _TOP, rate, top, normal, WINDOW_SECONDS
    return 0, rate, threshold, normal, WINDOW_SECONDS


def _cold_start_rules(
    state: VelocityState, rate: float, normal: float, now: float, params: VelocityPolicy
) -> tuple[int, float, float | None, float]:
    """The same rules for a key without an established baseline, against what it has shown
    (``normal``), never below the cold-start limits: (reason or 0, rate, limit, window)."""
    floor = params.cold_start_limit
    if floor is not None:
        spike = max(floor, params.spike_multiple * normal)
        if rate > spike and rate - max(state.largest) > spike:
            return _COLD, rate, spike, WINDOW_SECONDS
        top = (
            floor
            if params.ceiling_multiple is None
            else max(floor, params.ceiling_multiple * normal)
        )
        if params.cold_start_sustained is not None:  # a minute may spend ten minutes' budget
            top = max(top, params.cold_start_sustained * (LONG_WINDOW / MINUTE))
        if rate > top:
            return _COLD, rate, top, WINDOW_SECONDS
    budget = params.cold_start_sustained
    if budget is not None:
        budget = max(budget, params.sustained_baseline_multiple * normal)
        long_rate = _long_rate(state, now)
        # like the sustained rule, without the window's largest call
        if long_rate - max(state.minute_largest) * (MINUTE / LONG_WINDOW) > budget:
            return _BUDGET, long_rate, budget, LONG_WINDOW
    return 0, rate, None if floor is None else spike, WINDOW_SECONDS


def _judge(state: VelocityState, amount: float, now: float, params: VelocityPolicy) -> _Finding:
    rate = _sliding_sum(state.amounts, state.head, now, SLOT_SECONDS)
    # established() and manual_ceiling() inline: this runs on every record
    known = now - state.first_seen >= params.learning_period
    baseline = state.baseline if known and state.samples >= params.min_samples else None
    ceiling = state.limit_override if state.limit_override >= 0.0 else params.limit
    if ceiling is not None and rate > ceiling:
        return _MANUAL, rate, ceiling, baseline, WINDOW_SECONDS
    allowance = _allowance(state, now) if any(state.profile) else 0.0
    if baseline is not None and baseline >= params.min_baseline:
        normal = max(baseline, allowance, _typical_peak(state, params))
        return _established_rules(state, amount, rate, normal, now, params)
    if state.limit_override >= 0.0:  # an operator's limit for this key replaces cold start
        return 0, rate, ceiling, baseline, WINDOW_SECONDS
    shown = 0.0
    if state.samples >= params.cold_start_samples:
        shown = max(state.baseline, _typical_peak(state, params))
    reason, rate, limit, window = _cold_start_rules(state, rate, max(shown, allowance), now, params)
    return reason, rate, limit if reason or ceiling is None else ceiling, baseline, window


def _trip(state: VelocityState, finding: _Finding, now: float, params: VelocityPolicy) -> None:
    reason, rate, limit, baseline, window = finding
    recent = state.strikes > 0 and now - state.last_trip <= params.escalation_window
    state.strikes = state.strikes + 1 if recent else 1
    cooldown = min(params.cooldown * 2.0 ** (state.strikes - 1), params.cooldown_max)
    state.open_until = now + cooldown
    state.last_trip = now
    state.trip_reason = reason
    state.trip_rate = rate
    state.trip_limit = 0.0 if limit is None else limit
    state.trip_baseline = -1.0 if baseline is None else baseline
    state.trip_window = window
    state.early_level = 0.0  # the episode is over
    # The run-up to a trip is no normal traffic, nor is anything until the key closes.
    state.discard_through = max(state.discard_through, math.floor(state.open_until / MINUTE))


def _refusal(state: VelocityState, now: float, *, tripped: bool) -> VelocityVerdict:
    baseline = state.trip_baseline if state.trip_baseline >= 0.0 else None
    relative = baseline and state.trip_reason in _RELATIVE
    return VelocityVerdict(
        allowed=False,
        tripped=tripped,
        reason=REASON_CODES[state.trip_reason],
        rate=state.trip_rate,
        limit=state.trip_limit,
        baseline=baseline,
        multiple=state.trip_rate / baseline if relative and baseline else None,
        retry_after=state.open_until - now,
        window=state.trip_window,
    )


# -- operations ---------------------------------------------------------------------------------


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
    """Add ``amount`` at ``now`` and judge the key; a trip opens it.

    Amounts recorded while the key is open still count (they were paid for by calls that
    passed the gate before the trip) but cannot trip it again.
    """
    # The hot path of every guarded call: each window moved only when ``now`` left its slot.
    if now >= (state.minute_head + 1) * MINUTE:
        _roll_minutes(state, now, params)
    slot = math.floor(now / SLOT_SECONDS)
    if slot > state.head:
        _advance_to(state, slot)
    slot = state.head % SLOTS
    state.amounts[slot] += amount
    if amount > state.largest[slot]:
        state.largest[slot] = amount
    minute = state.minute_head % LONG_SLOTS
    state.minute_amounts[minute] += amount
    if amount > state.minute_largest[minute]:
        state.minute_largest[minute] = amount
    state.minute_calls[minute] += 1.0
    if state.open_until > now:
        return _refusal(state, now, tripped=False)
    finding = _judge(state, amount, now, params)
    reason, rate, limit, baseline, _ = finding
    if reason and limit is not None:
        _trip(state, finding, now, params)
        return _refusal(state, now, tripped=True)
    # allowed, tripped, reason, rate, limit, baseline, multiple: positional, which is faster
    return VelocityVerdict(True, False, None, rate, limit, baseline,
                           rate / baseline if baseline else None)  # fmt: skip


def _clear_windows(state: VelocityState) -> None:
    state.head = -1
    state.amounts = _zeros(SLOTS)
    state.largest = _zeros(SLOTS)
    state.minute_head = -1
    state.minute_amounts = _zeros(LONG_SLOTS)
    state.minute_largest = _zeros(LONG_SLOTS)
    state.minute_calls = _zeros(LONG_SLOTS)
    state.early_level = 0.0
    state.excused_slot = -1
    state.excused_amount = 0.0


def reset(state: VelocityState) -> None:
    """Close the key at once and forget its windows and escalation; keep what it learned.

    The minutes still in the long window are dropped, not learned."""
    state.open_until = 0.0
    state.strikes = 0
    _clear_windows(state)


def forgive(state: VelocityState) -> None:
    """Close the key at once and teach that its last trip's rate is normal at that hour of
    day (and the next, which a job that starts late in the hour runs into). A manual ceiling
    is the operator's own limit: forgiving it teaches nothing."""
    if state.last_trip > 0.0 and state.trip_rate > 0.0 and state.trip_reason != _MANUAL:
        hour = math.floor(state.last_trip / HOUR) % 24
        _teach(state, hour, state.trip_rate)
        _teach(state, (hour + 1) % 24, state.trip_rate)
    state.open_until = 0.0
    state.strikes = 0
    state.early_level = 0.0


def as_of(state: VelocityState, now: float, params: VelocityPolicy) -> VelocityState:
    """A copy of the key's state as its next record at ``now`` would find it: the minutes that
    left the long window learned (for status, which changes nothing)."""
    probe = replace(
        state,
        amounts=list(state.amounts),
        largest=list(state.largest),
        minute_amounts=list(state.minute_amounts),
        minute_largest=list(state.minute_largest),
        minute_calls=list(state.minute_calls),
        profile=list(state.profile),
    )
    _roll_minutes(probe, now, params)
    return probe


def rate_at(state: VelocityState, now: float) -> float:
    """The rate over the 60 s before ``now``, read without moving the key's ring (for status)."""
    if state.head < 0 or math.floor(now / SLOT_SECONDS) - state.head >= SLOTS:
        return 0.0  # nothing recorded, or all of it older than the window
    probe = replace(state, amounts=list(state.amounts), largest=list(state.largest))
    _advance(probe, now)
    return _rate(probe, now)
