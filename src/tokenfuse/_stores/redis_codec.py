"""What ``RedisStore`` sends to its Lua scripts and how it reads their replies.

Plain functions shared by the sync and the async paths, which differ only in awaiting the
script call. Nothing here does I/O.

Every number crosses exactly: ``repr`` text or packed doubles on the way in, ``%.17g`` text
on the way out, so verdicts and state are the very doubles the pure core computes.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any

from .._core.admission import AdmitVerdict
from .._core.bucket import BucketPolicy, BucketState, BucketVerdict
from .._core.velocity import (
    LONG_SLOTS,
    PROFILE_WORDS,
    REASON_CODES,
    SLOTS,
    VelocityPolicy,
    VelocityState,
    VelocityVerdict,
)
from .._errors import ConfigurationError
from . import base
from .base import KeyStatus, Unset

__all__ = [
    "BUCKET_BLOCK",
    "BUCKET_LAYOUT",
    "VELOCITY_BLOCK",
    "VELOCITY_LAYOUT",
    "admit_args",
    "admit_verdict",
    "bucket_state",
    "configure_args",
    "key_of",
    "key_status",
    "read_state",
    "record_args",
    "velocity_state",
    "velocity_verdict",
]

#: The blocks of an identity's string (``_lib.lua``): little-endian doubles in this order. The
#: velocity block goes on with its rings (``VELOCITY_RINGS``) and ``limit_override`` (87
#: doubles, 696 bytes, in all); the bucket block with ``capacity_override`` and
#: ``rate_override`` (8 doubles, 64 bytes).
VELOCITY_LAYOUT = (
    "first_seen", "open_until", "head", "minute_head", "baseline", "calls", "weight", "samples",
    "learned_at", "discard_through", "strikes", "last_trip", "trip_reason", "trip_rate",
    "trip_limit", "trip_baseline", "trip_window", "early_level", "early_at", "early_since",
    "early_amount", "excused_slot", "excused_amount",
)  # fmt: skip
VELOCITY_RINGS = (
    ("amounts", SLOTS), ("largest", SLOTS), ("minute_amounts", LONG_SLOTS),
    ("minute_largest", LONG_SLOTS), ("minute_calls", LONG_SLOTS), ("profile", PROFILE_WORDS),
)  # fmt: skip
BUCKET_LAYOUT = ("tokens", "updated", "use_minute", "use_amount", "hot_since", "alerted")
VELOCITY_BLOCK = struct.Struct(
    "<" + "d" * (len(VELOCITY_LAYOUT) + sum(size for _, size in VELOCITY_RINGS) + 1)
)
BUCKET_BLOCK = struct.Struct("<" + "d" * (len(BUCKET_LAYOUT) + 2))
_VELOCITY_POLICY = struct.Struct("<16d")
_BUCKET_POLICY = struct.Struct("<4d")
_V_INTS = frozenset(
    {"head", "minute_head", "samples", "discard_through", "strikes", "trip_reason", "excused_slot"}
)
_B_INTS = frozenset({"use_minute", "hot_since"})


def key_of(prefix: str, key: str) -> str:
    """The identity's one Redis key, ``<prefix>:{<key>}`` (its hash tag picks the slot)."""
    if not key:
        # '{}' is no hash tag at all: the slot would be the whole name's.
        raise ConfigurationError("store keys must not be empty")
    return f"{prefix}:{{{key}}}"


# -- arguments ----------------------------------------------------------------------------------
# Numbers the scripts read once go as repr() text; policies go as packed doubles, encoded once
# per policy object (policies are frozen and few) and unpacked by one C call in Lua.


def _number(value: float) -> str:
    return repr(float(value))


def _none_as_minus_one(value: float | None) -> float:
    return -1.0 if value is None else value


@functools.lru_cache(maxsize=256)
def _velocity_policy(policy: VelocityPolicy) -> bytes:
    return _VELOCITY_POLICY.pack(
        _none_as_minus_one(policy.limit),
        policy.spike_multiple,
        policy.min_baseline,
        policy.learning_period,
        policy.min_samples,
        _none_as_minus_one(policy.cold_start_limit),
        _none_as_minus_one(policy.cold_start_sustained),
        policy.half_life,
        policy.sustained_multiple,
        policy.sustained_baseline_multiple,
        _none_as_minus_one(policy.early_threshold),
        _none_as_minus_one(policy.ceiling_multiple),
        policy.learn_clip,
        policy.cooldown,
        policy.cooldown_max,
        policy.escalation_window,
    )


@functools.lru_cache(maxsize=256)
def _bucket_policy(policy: BucketPolicy) -> bytes:
    return _BUCKET_POLICY.pack(
        policy.rate, policy.capacity, policy.near_limit_fraction, policy.near_limit_after
    )


def record_args(
    now: str, ttl: str, amount: float, velocity: VelocityPolicy
) -> tuple[str | bytes, ...]:
    return (now, ttl, _number(amount), _velocity_policy(velocity))


def admit_args(
    now: str,
    ttl: str,
    cost: float,
    amount: float,
    velocity: VelocityPolicy | None,
    bucket: BucketPolicy | None,
) -> tuple[str | bytes, ...]:
    return (
        now,
        ttl,
        _number(cost),
        _number(amount),
        b"" if velocity is None else _velocity_policy(velocity),
        b"" if bucket is None else _bucket_policy(bucket),
    )


def _override(value: float | None | Unset) -> str:
    if isinstance(value, Unset):
        return ""
    return "-1.0" if value is None else _number(value)


def configure_args(
    now: str,
    ttl: str,
    limit: float | None | Unset,
    capacity: float | None | Unset,
    rate: float | None | Unset,
) -> tuple[str, ...]:
    return (now, ttl, _override(limit), _override(capacity), _override(rate))


# -- replies ------------------------------------------------------------------------------------
# One text reply per decision (bytes, or str with decode_responses): space-separated fields,
# floats exact (%.17g), None as 'nan'. split() and float() accept bytes and str alike.


def _maybe(text: bytes | str) -> float | None:
    value = float(text)
    return None if value != value else value


def _velocity_verdict(fields: Sequence[Any]) -> VelocityVerdict:
    allowed, tripped, reason, rate, limit, baseline, multiple, retry_after, window = fields
    return VelocityVerdict(
        allowed=int(allowed) == 1,
        tripped=int(tripped) == 1,
        reason=REASON_CODES.get(int(reason)),
        rate=float(rate),
        limit=_maybe(limit),
        baseline=_maybe(baseline),
        multiple=_maybe(multiple),
        retry_after=float(retry_after),
        window=_maybe(window),
    )


def velocity_verdict(reply: bytes | str) -> VelocityVerdict:
    fields = reply.split()
    if len(fields) == 1:  # '1': allowed, nothing else to say (a fresh object: verdicts mutate)
        return VelocityVerdict(allowed=True)
    return _velocity_verdict(fields)


def _bucket_verdict(fields: Sequence[Any]) -> BucketVerdict:
    allowed, remaining, capacity, rate, retry_after, near_limit = fields
    return BucketVerdict(
        allowed=int(allowed) == 1,
        remaining=float(remaining),
        capacity=float(capacity),
        rate=float(rate),
        retry_after=float(retry_after),
        near_limit=int(near_limit) == 1,
    )


def admit_verdict(reply: bytes | str) -> AdmitVerdict:
    fields = reply.split()
    return AdmitVerdict(
        allowed=int(fields[0]) == 1,
        velocity=None if int(fields[1]) < 0 else _velocity_verdict(fields[1:10]),
        bucket=None if int(fields[10]) < 0 else _bucket_verdict(fields[10:16]),
    )


# -- state ----------------------------------------------------------------------------------------


def read_state(blob: bytes | None) -> tuple[VelocityState | None, BucketState | None]:
    """The core's state objects from an identity's string as stored (``GET`` of ``key_of``):
    the velocity block, if any, then the bucket block, if any; the length says which."""
    if not blob:
        return None, None
    vstate = bstate = None
    if len(blob) != BUCKET_BLOCK.size:
        numbers = VELOCITY_BLOCK.unpack_from(blob)
        vstate = velocity_state(numbers[:-1], numbers[-1])
    if len(blob) != VELOCITY_BLOCK.size:
        numbers = BUCKET_BLOCK.unpack_from(blob, len(blob) - BUCKET_BLOCK.size)
        bstate = bucket_state(numbers[:-2], *numbers[-2:])
    return vstate, bstate


def velocity_state(numbers: Sequence[float], limit_override: float = -1.0) -> VelocityState:
    """The core's state object from the velocity block's doubles (``VELOCITY_LAYOUT``, then
    ``VELOCITY_RINGS``)."""
    state = VelocityState(first_seen=numbers[0])
    at = len(VELOCITY_LAYOUT)
    for name, value in zip(VELOCITY_LAYOUT[1:], numbers[1:at], strict=True):
        setattr(state, name, int(value) if name in _V_INTS else value)
    for name, size in VELOCITY_RINGS:
        setattr(state, name, list(numbers[at : at + size]))
        at += size
    state.limit_override = limit_override
    return state


def bucket_state(
    numbers: Sequence[float], capacity_override: float = -1.0, rate_override: float = -1.0
) -> BucketState:
    """The core's state object from the bucket block's doubles (``BUCKET_LAYOUT``)."""
    state = BucketState(tokens=numbers[0], updated=numbers[1])
    for name, value in zip(BUCKET_LAYOUT[2:], numbers[2:], strict=True):
        setattr(state, name, int(value) if name in _B_INTS else value)
    state.alerted = bool(state.alerted)
    state.capacity_override = capacity_override
    state.rate_override = rate_override
    return state


def key_status(
    reply: Sequence[Any], velocity: VelocityPolicy, bucket: BucketPolicy | None
) -> KeyStatus:
    """``status.lua``'s raw state, viewed through the core (as ``MemoryStore.status`` does)."""
    now = float(reply[0])
    numbers = [float(text) for text in reply[1].split()]
    vstate = velocity_state(numbers[:-1], numbers[-1]) if numbers else None
    numbers = [float(text) for text in reply[2].split()]
    bstate = bucket_state(numbers[:-2], *numbers[-2:]) if numbers else None
    return base.key_status(vstate, bstate, now, velocity, bucket)
