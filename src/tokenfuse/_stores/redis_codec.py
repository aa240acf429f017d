"""What ``RedisStore`` sends to each operation's Lua script and how it reads the reply, and the
layout of the state the scripts keep. Nothing here does I/O.

Every number crosses exactly: ``repr`` text or packed doubles on the way in, ``%.17g`` text
on the way out, so verdicts and state are the very doubles the pure core computes.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .._core.admission import AdmitVerdict
from .._core.bucket import BucketPolicy, BucketState, BucketVerdict
from .._core.status import Status, status_of
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
from .ops import (
    Admit,
    Configure,
    Forgive,
    Gate,
    Op,
    ReadState,
    ReadStatus,
    Record,
    RecordBatch,
    Reset,
    StoredState,
    Unset,
)

__all__ = [
    "BUCKET_BLOCK",
    "BUCKET_LAYOUT",
    "CODECS",
    "VELOCITY_BLOCK",
    "VELOCITY_LAYOUT",
    "VELOCITY_RINGS",
    "Codec",
    "bucket_state",
    "key_of",
    "states_of",
    "velocity_state",
]

# -- the state layout -----------------------------------------------------------------------------
# The one description of how an identity's state is stored (docs/design.md#state-layout says
# why; lua/_lib.lua reads and writes it in this order).
#
# An identity is one Redis string, ``<prefix>:{<key>}`` (``key_of``; the hash tag picks its
# cluster slot), written with its TTL by every operation that writes. It holds up to two
# blocks of little-endian doubles, each only when the identity has that state, in this order:
#
#   velocity block  VELOCITY_LAYOUT, the rings of VELOCITY_RINGS,      87 doubles, 696 bytes
#                   limit_override
#   bucket block    BUCKET_LAYOUT, capacity_override, rate_override      8 doubles,  64 bytes
#
# so the string is 696, 64 or 760 bytes long and its length says which blocks it holds. The
# forgiven hourly allowances (``profile``) are 24 bytes, six to a double.
# Integers (``_V_INTS``, ``_B_INTS``) and ``alerted`` (0 or 1) are stored as doubles too; an
# override of -1 means none.

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


def states_of(raw: bytes) -> tuple[VelocityState | None, BucketState | None]:
    """The core's state objects from an identity's whole string (a raw ``GET``); a string
    of no known length (not tokenfuse's) reads as no state."""
    velocity = bucket = None
    if len(raw) in (VELOCITY_BLOCK.size, VELOCITY_BLOCK.size + BUCKET_BLOCK.size):
        numbers = VELOCITY_BLOCK.unpack_from(raw)
        velocity = velocity_state(numbers[:-1], numbers[-1])
    if len(raw) in (BUCKET_BLOCK.size, VELOCITY_BLOCK.size + BUCKET_BLOCK.size):
        numbers = BUCKET_BLOCK.unpack_from(raw, len(raw) - BUCKET_BLOCK.size)
        bucket = bucket_state(numbers[:-2], *numbers[-2:])
    return velocity, bucket


# -- arguments ------------------------------------------------------------------------------------
# Each script's ARGV is described in its header (lua/<name>.lua). ``now`` is '' for the server's
# clock; numbers the scripts read once go as repr() text; policies go as packed doubles,
# encoded once per policy object (policies are frozen and few) and unpacked by one C call.

Args = tuple[str | bytes, ...]

_VELOCITY_POLICY = struct.Struct("<16d")
_BUCKET_POLICY = struct.Struct("<4d")


def _number(value: float) -> str:
    return repr(float(value))


def _none_as_minus_one(value: float | None) -> float:
    return -1.0 if value is None else value


@functools.lru_cache(maxsize=256)
def _velocity_policy(policy: VelocityPolicy | None) -> bytes:
    if policy is None:
        return b""
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
def _bucket_policy(policy: BucketPolicy | None) -> bytes:
    if policy is None:
        return b""
    return _BUCKET_POLICY.pack(
        policy.rate, policy.capacity, policy.near_limit_fraction, policy.near_limit_after
    )


def _override(value: float | None | Unset) -> str:
    if isinstance(value, Unset):
        return ""
    return "-1.0" if value is None else _number(value)


def _now_only(op: Gate | ReadStatus | ReadState, now: str, ttl: str) -> Args:
    return (now,)


def _record_args(op: Record, now: str, ttl: str) -> Args:
    return (now, ttl, _number(op.amount), _velocity_policy(op.velocity))


def _record_batch_args(op: RecordBatch, now: str, ttl: str) -> Args:
    # The amounts as one argument of packed doubles: a thousand arguments would cost the
    # client an encoding each, and the server a string each.
    amounts = op.amounts
    return (now, ttl, _velocity_policy(op.velocity), struct.pack(f"<{len(amounts)}d", *amounts))


def _admit_args(op: Admit, now: str, ttl: str) -> Args:
    velocity, bucket = _velocity_policy(op.velocity), _bucket_policy(op.bucket)
    return (now, ttl, _number(op.cost), _number(op.amount), velocity, bucket)


def _ttl_only(op: Reset | Forgive, now: str, ttl: str) -> Args:
    return (ttl,)


def _configure_args(op: Configure, now: str, ttl: str) -> Args:
    return (now, ttl, _override(op.limit), _override(op.capacity), _override(op.rate))


# -- replies --------------------------------------------------------------------------------------
# One text reply per decision (bytes, or str with decode_responses): space-separated fields,
# floats exact (%.17g), None as 'nan'. split() and float() accept bytes and str alike.


def _maybe(text: bytes | str) -> float | None:
    value = float(text)
    return None if value != value else value


def _velocity_fields(fields: Sequence[Any]) -> VelocityVerdict:
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


def _bucket_fields(fields: Sequence[Any]) -> BucketVerdict:
    allowed, remaining, capacity, rate, retry_after, near_limit = fields
    return BucketVerdict(
        allowed=int(allowed) == 1,
        remaining=float(remaining),
        capacity=float(capacity),
        rate=float(rate),
        retry_after=float(retry_after),
        near_limit=int(near_limit) == 1,
    )


def _velocity_verdict(op: Gate | Record | RecordBatch, reply: bytes | str) -> VelocityVerdict:
    fields = reply.split()
    if len(fields) == 1:  # '1': allowed, nothing else to say (a fresh object: verdicts mutate)
        return VelocityVerdict(allowed=True)
    return _velocity_fields(fields)


def _admit_verdict(op: Admit, reply: bytes | str) -> AdmitVerdict:
    fields = reply.split()
    return AdmitVerdict(
        allowed=int(fields[0]) == 1,
        velocity=None if int(fields[1]) < 0 else _velocity_fields(fields[1:10]),
        bucket=None if int(fields[10]) < 0 else _bucket_fields(fields[10:16]),
    )


def _key_state(op: ReadState | ReadStatus, reply: Sequence[Any]) -> StoredState:
    """``status.lua``'s reply: the key's raw state, as the core's state objects."""
    numbers = [float(text) for text in reply[1].split()]
    vstate = velocity_state(numbers[:-1], numbers[-1]) if numbers else None
    numbers = [float(text) for text in reply[2].split()]
    bstate = bucket_state(numbers[:-2], *numbers[-2:]) if numbers else None
    return StoredState(op.key, float(reply[0]), vstate, bstate)


def _status(op: ReadStatus, reply: Sequence[Any]) -> Status:
    """``status.lua``'s raw state, viewed through the core (as ``MemoryStore`` does)."""
    state = _key_state(op, reply)
    return status_of(op.key, state.velocity, state.bucket, state.now, op.velocity, op.bucket)


def _nothing(op: Reset | Forgive | Configure, reply: object) -> None:
    return None


# -- one codec per operation ----------------------------------------------------------------------

OpT = TypeVar("OpT", bound=Op[Any])
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Codec(Generic[OpT, T]):
    """How ``RedisStore`` runs one kind of operation with its script (``lua/<op.name>.lua``)."""

    args: Callable[[OpT, str, str], Args]
    """The script's ARGV from the operation, ``now`` ('' for the server's clock) and the TTL
    in milliseconds, both as text."""
    result: Callable[[OpT, Any], T]
    """The operation's result from the script's reply."""


#: Every operation ``RedisStore`` runs, with its codec; ``redis_scripts`` loads their scripts.
CODECS: dict[type[Op[Any]], Codec[Any, Any]] = {
    Gate: Codec(_now_only, _velocity_verdict),
    Record: Codec(_record_args, _velocity_verdict),
    RecordBatch: Codec(_record_batch_args, _velocity_verdict),
    Admit: Codec(_admit_args, _admit_verdict),
    ReadStatus: Codec(_now_only, _status),
    ReadState: Codec(_now_only, _key_state),
    Reset: Codec(_ttl_only, _nothing),
    Forgive: Codec(_ttl_only, _nothing),
    Configure: Codec(_configure_args, _nothing),
}
