"""What ``RedisStore`` sends to each operation's Lua script and how it reads the reply, and the
layout of the state the scripts keep. Nothing here does I/O.

Every number crosses exactly: ``repr`` text or packed doubles on the way in, packed doubles
(decisions) or ``%.17g`` text (the rest) on the way out, so verdicts and state are the very
doubles the pure core computes.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .._core.admission import AdmitVerdict
from .._core.bucket import BucketPolicy, BucketState, BucketVerdict
from .._core.budget import RunState, RunVerdict
from .._core.lease import LeaseVerdict
from .._core.loops import (
    ERROR_LENGTH,
    FINGERPRINT_LENGTH,
    LOOP_REASONS,
    LoopCall,
    LoopPolicy,
    LoopState,
    LoopVerdict,
    clean_error,
)
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
from .._errors import ConfigurationError, StoreUnavailable
from .ops import (
    Admit,
    CheckLoops,
    Configure,
    ForgetLoops,
    Forgive,
    Gate,
    Lease,
    NoteLoop,
    NoteLoopBatch,
    Op,
    OpenRun,
    ReadRun,
    ReadState,
    ReadStatus,
    Record,
    RecordBatch,
    Reserve,
    Reset,
    ReturnLease,
    Settle,
    StoredState,
    Unset,
)

__all__ = [
    "BUCKET_BLOCK",
    "BUCKET_LAYOUT",
    "CODECS",
    "LOOP_CALL",
    "RUN_BLOCK",
    "RUN_LAYOUT",
    "VELOCITY_BLOCK",
    "VELOCITY_LAYOUT",
    "VELOCITY_RINGS",
    "Codec",
    "bucket_state",
    "key_of",
    "loop_state",
    "loop_verdict_of",
    "loops_key_of",
    "run_state",
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
#   velocity block  VELOCITY_LAYOUT, the rings of VELOCITY_RINGS,      88 doubles, 704 bytes
#                   limit_override
#   bucket block    BUCKET_LAYOUT, capacity_override, rate_override      8 doubles,  64 bytes
#
# so the string is 704, 64 or 768 bytes long and its length says which blocks it holds. The
# forgiven hourly allowances (``profile``) are 24 bytes, six to a double.
# Integers (``_V_INTS``, ``_B_INTS``) and ``alerted`` (0 or 1) are stored as doubles too; an
# override of -1 means none.

VELOCITY_LAYOUT = (
    "first_seen", "open_until", "head", "minute_head", "baseline", "calls", "weight", "samples",
    "learned_at", "discard_through", "strikes", "last_trip", "trip_reason", "trip_rate",
    "trip_limit", "trip_baseline", "trip_window", "early_level", "early_at", "early_since",
    "early_amount", "excused_slot", "excused_amount", "spread",
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
# A run (``tokenfuse.run``) is one string of its own, ``<prefix>:{run:<keyed hash>}``: RUN_LAYOUT
# as little-endian doubles, 72 bytes, written with the run's own TTL (lua/_budget.lua).
RUN_LAYOUT = (
    "token_limit", "usd_limit", "spent_tokens", "spent_usd", "reserved_tokens", "reserved_usd",
    "expires", "near_alerted", "exceeded_alerted",
)  # fmt: skip
RUN_BLOCK = struct.Struct("<" + "d" * len(RUN_LAYOUT))
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


# Bounded, as a few callers call again and again: made once per key, not per loop check (the
# middleware's, answered by the open-key view, has no other work to hide it).
@functools.lru_cache(maxsize=1024)
def loops_key_of(prefix: str, key: str) -> str:
    """The identity's failure-loop string, ``<prefix>:loops:{<key>}``: apart from its state
    (no listing or state script ever reads it), in the same slot (the same hash tag)."""
    return f"{prefix}:loops:{key_of('', key)[1:]}"


# The failure-loop string (lua/_lib.lua, "The failure-loop breaker"): one record per call,
# oldest first: the fingerprint (16 hex characters), the last error type (32 characters,
# padded with spaces), then 9 doubles: last_seen, sends, sends_since, failures,
# failures_since, open_until, status, strikes, last_trip. 120 bytes a call, at most max_calls
# (16) of them; the
# string expires an hour after its last call would be forgotten (at most the store's TTL).
LOOP_CALL = struct.Struct(f"<{FINGERPRINT_LENGTH}s{ERROR_LENGTH}s9d")


def loop_state(raw: bytes | None) -> LoopState:
    """The core's loop state from an identity's failure-loop string (a raw ``GET``)."""
    calls = []
    for at in range(0, len(raw or b"") // LOOP_CALL.size * LOOP_CALL.size, LOOP_CALL.size):
        mark, error, *numbers = LOOP_CALL.unpack_from(raw or b"", at)
        (last_seen, sends, sends_since, failures, failures_since, open_until, status, strikes,
         last_trip) = numbers  # fmt: skip
        calls.append(
            LoopCall(
                mark.decode("ascii"),
                last_seen,
                sends,
                sends_since,
                failures,
                failures_since,
                open_until,
                status,
                error.decode("ascii").rstrip(" "),
                strikes,
                last_trip,
            )
        )
    return LoopState(calls)


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
# The decisions' own numbers (Record's and Admit's now, TTL, amount, cost) go as one argument
# of packed doubles, now -1 for the server's clock: redis-py spends some 7,500 instructions
# encoding each argument of a command, more than a pack of all of them.

Args = tuple[str | bytes, ...]

_VELOCITY_POLICY = struct.Struct("<18d")
_RECORD_CALL = struct.Struct("<3d")  # now, ttl ms, amount
_ADMIT_CALL = struct.Struct("<4d")  # now, ttl ms, cost, amount
_BUCKET_POLICY = struct.Struct("<4d")


def _number(value: float) -> str:
    return repr(float(value))


def _packed_now(now: str) -> float:
    """``now`` in a packed call: -1 for the server's clock ('')."""
    return float(now) if now else -1.0


def _none_as_minus_one(value: float | None) -> float:
    return -1.0 if value is None else value


# Policies are encoded once per policy object and found again by identity: an lru_cache keyed
# by the policy would hash and compare its eighteen fields on every decision.
_ENCODED: dict[int, tuple[object, bytes]] = {}
_ENCODED_MAX = 256


def _encoded_before(policy: object) -> bytes | None:
    entry = _ENCODED.get(id(policy))
    return entry[1] if entry is not None and entry[0] is policy else None


def _remember(policy: object, encoded: bytes) -> bytes:
    if len(_ENCODED) >= _ENCODED_MAX:  # bounded: policies are few, unless made per call
        _ENCODED.clear()
    _ENCODED[id(policy)] = (policy, encoded)  # holding it keeps its id from being reused
    return encoded


def _velocity_policy(policy: VelocityPolicy | None) -> bytes:
    if policy is None:
        return b""
    return _encoded_before(policy) or _remember(policy, _pack_velocity_policy(policy))


def _bucket_policy(policy: BucketPolicy | None) -> bytes:
    if policy is None:
        return b""
    return _encoded_before(policy) or _remember(policy, _pack_bucket_policy(policy))


def _pack_velocity_policy(policy: VelocityPolicy) -> bytes:
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
        _none_as_minus_one(policy.rms_share),
        policy.cold_start_samples,
    )


def _pack_bucket_policy(policy: BucketPolicy) -> bytes:
    return _BUCKET_POLICY.pack(
        policy.rate, policy.capacity, policy.near_limit_fraction, policy.near_limit_after
    )


@functools.lru_cache(maxsize=256)
def _loop_policy(policy: LoopPolicy) -> bytes:
    return struct.pack(
        "<8d",
        policy.failures,
        policy.failure_window,
        policy.cooldown,
        policy.repeats,
        policy.repeat_window,
        1.0 if policy.refuse_repeats else 0.0,
        policy.max_calls,
        policy.cooldown_max,
    )


def _fingerprint(mark: str) -> str:
    if len(mark) != FINGERPRINT_LENGTH or mark.strip("0123456789abcdef"):
        raise ConfigurationError(f"a loop fingerprint is {FINGERPRINT_LENGTH} hex characters")
    return mark


def _check_loops_args(op: CheckLoops, now: str, ttl: str) -> Args:
    count = "0" if op.local else "1"
    return (now, ttl, _fingerprint(op.fingerprint), _loop_policy(op.policy), count)


def _outcome(failed: bool | None) -> str:
    return "" if failed is None else "1" if failed else "0"


def _note_loop_args(op: NoteLoop, now: str, ttl: str) -> Args:
    mark, policy = _fingerprint(op.fingerprint), _loop_policy(op.policy)
    status, error, send = _number(op.status), clean_error(op.error), "1" if op.send else "0"
    return (now, ttl, mark, policy, _outcome(op.failed), status, error, send)


#: Bytes of one note in ``note_loop_batch.lua``'s packed argument.
NOTE_SIZE = 58
_OUTCOMES = {True: b"1", False: b"0", None: b"-"}


def _note_loop_batch_args(op: NoteLoopBatch, now: str, ttl: str) -> Args:
    # The notes as one argument of fixed-size records, as RecordBatch packs its amounts: a
    # batch's hundreds of notes would otherwise cost the client five encodings each.
    parts = [
        _fingerprint(note.fingerprint).encode("ascii")
        + _OUTCOMES[note.failed]
        + (b"1" if note.send else b"0")
        + struct.pack("<d", float(note.status))
        + clean_error(note.error).encode("ascii").ljust(ERROR_LENGTH)
        for note in op.notes
    ]
    return (now, ttl, _loop_policy(op.policy), b"".join(parts))


def _forget_loops_args(op: ForgetLoops, now: str, ttl: str) -> Args:
    return (ttl, _fingerprint(op.fingerprint) if op.fingerprint else "")


def _override(value: float | None | Unset) -> str:
    if isinstance(value, Unset):
        return ""
    return "-1.0" if value is None else _number(value)


def _now_only(op: Gate | ReadStatus | ReadState, now: str, ttl: str) -> Args:
    return (now,)


def _record_args(op: Record, now: str, ttl: str) -> Args:
    call = _RECORD_CALL.pack(_packed_now(now), float(ttl), op.amount)
    return (call, _velocity_policy(op.velocity))


def _record_batch_args(op: RecordBatch, now: str, ttl: str) -> Args:
    # The amounts as one argument of packed doubles: a thousand arguments would cost the
    # client an encoding each, and the server a string each.
    amounts = op.amounts
    return (now, ttl, _velocity_policy(op.velocity), struct.pack(f"<{len(amounts)}d", *amounts))


def _admit_args(op: Admit, now: str, ttl: str) -> Args:
    call = _ADMIT_CALL.pack(_packed_now(now), float(ttl), op.cost, op.amount)
    return (call, _velocity_policy(op.velocity), _bucket_policy(op.bucket))


def _lease_args(op: Lease, now: str, ttl: str) -> Args:
    velocity, bucket = _velocity_policy(op.velocity), _bucket_policy(op.bucket)
    numbers = (_number(op.cost), _number(op.amount), _number(op.want), _number(op.give_back))
    return (now, ttl, *numbers, velocity, bucket, *map(_number, op.pending))


def _return_lease_args(op: ReturnLease, now: str, ttl: str) -> Args:
    velocity, bucket = _velocity_policy(op.velocity), _bucket_policy(op.bucket)
    return (now, ttl, _number(op.give_back), velocity, bucket, *map(_number, op.pending))


def _ttl_only(op: Reset | Forgive, now: str, ttl: str) -> Args:
    return (ttl,)


def _configure_args(op: Configure, now: str, ttl: str) -> Args:
    return (now, ttl, _override(op.limit), _override(op.capacity), _override(op.rate))


def _ttl_ms(ttl: float) -> str:
    return str(max(1, round(ttl * 1000)))


def _open_run_args(op: OpenRun, now: str, ttl: str) -> Args:
    limits = (_number(op.token_limit), _number(op.usd_limit))
    return (now, _ttl_ms(op.ttl), _number(op.ttl), *limits, "1" if op.join else "0")


def _reserve_args(op: Reserve, now: str, ttl: str) -> Args:
    return (now, _ttl_ms(op.ttl), _number(op.ttl), _number(op.tokens), _number(op.usd))


def _settle_args(op: Settle, now: str, ttl: str) -> Args:
    held = (_number(op.held_tokens), _number(op.held_usd))
    return (now, _ttl_ms(op.ttl), _number(op.ttl), *held, _number(op.tokens), _number(op.usd))


def _read_run_args(op: ReadRun, now: str, ttl: str) -> Args:
    return (now,)


# -- replies --------------------------------------------------------------------------------------
# Decisions (Gate, Record, RecordBatch, Admit, Lease, ReturnLease) reply with packed
# little-endian doubles, None as NaN: one struct.pack in the script, one unpack here, exact.
# They were %.17g text once: glibc's exact printf cost the server about 5.7 us of a record's
# 40, and the client a split() and a float() per field (docs/design.md#state-layout). Every
# script's reply is read undecoded (``NEVER_DECODE``), so this works for clients built with
# decode_responses=True too. The layouts (lua/_lib.lua, "Verdicts"):
#
#   velocity verdict  allowed (1, 0, or -1: None), then as its length says:
#                     8 bytes   nothing more (the gate's common answer; or None)
#                     40 bytes  an allowed record: rate, limit, baseline, multiple
#                     72 bytes  tripped, reason, rate, limit, baseline, multiple,
#                               retry_after, window
#   Admit             allowed, bucket verdict (6 doubles: allowed (-1: None), remaining,
#                     capacity, rate, retry_after, near_limit), velocity verdict to the end
#   Lease             granted, the first trip's velocity verdict (72 bytes, allowed -1:
#                     None), then Admit's reply
#   ReturnLease       the first trip's velocity verdict, or None (8 bytes)
#
# A reply of any other length (a server or a proxy that mangled it) raises StoreUnavailable,
# the store's failure like any other: the fuse fails open or closed as it was told.
# The other scripts reply with space-separated text fields, floats exact (%.17g), None as
# 'nan': split() and float() accept bytes and str alike.

_DOUBLE = struct.Struct("<d")
_ALLOWED_RECORD = struct.Struct("<5d")
_VELOCITY_VERDICT = struct.Struct("<9d")
_ADMISSION = struct.Struct("<7d")  # allowed, then the bucket verdict
_LEASE_HEAD = _DOUBLE  # granted, before the first trip's verdict


def _unreadable(op: Op[Any], reply: object) -> StoreUnavailable:
    shown = reply[:80] if isinstance(reply, (bytes, str)) else type(reply).__name__
    return StoreUnavailable(f"redis {op.name}: unreadable reply {shown!r}")


def _packed(op: Op[Any], reply: Any) -> bytes:
    """A decision's reply, which is packed doubles (bytes), or unreadable."""
    if not isinstance(reply, bytes):
        raise _unreadable(op, reply)
    return reply


def _maybe(value: float) -> float | None:
    return None if value != value else value


def _velocity_of(op: Op[Any], reply: bytes, at: int = 0) -> VelocityVerdict | None:
    """The velocity verdict packed in ``reply`` from byte ``at`` to the end (None: no verdict)."""
    size = len(reply) - at
    if size == _ALLOWED_RECORD.size:  # the common record
        _, rate, limit, baseline, multiple = _ALLOWED_RECORD.unpack_from(reply, at)
        return VelocityVerdict(True, False, None, rate, _maybe(limit), _maybe(baseline),
                               _maybe(multiple))  # fmt: skip
    if size == _DOUBLE.size:  # allowed, nothing more (a fresh object: verdicts mutate); or None
        (allowed,) = _DOUBLE.unpack_from(reply, at)
        if allowed == 1:
            return VelocityVerdict(allowed=True)
        if allowed == -1:
            return None
    if size != _VELOCITY_VERDICT.size:
        raise _unreadable(op, reply)
    allowed, tripped, reason, rate, limit, baseline, multiple, retry_after, window = (
        _VELOCITY_VERDICT.unpack_from(reply, at)
    )
    if allowed < 0:
        return None
    return VelocityVerdict(
        allowed=allowed == 1,
        tripped=tripped == 1,
        reason=REASON_CODES.get(int(reason)),
        rate=rate,
        limit=_maybe(limit),
        baseline=_maybe(baseline),
        multiple=_maybe(multiple),
        retry_after=retry_after,
        window=_maybe(window),
    )


def _admission_of(op: Op[Any], reply: bytes, at: int = 0) -> AdmitVerdict:
    """admit.lua's reply, packed in ``reply`` from byte ``at`` to the end."""
    if len(reply) - at < _ADMISSION.size:
        raise _unreadable(op, reply)
    allowed, bucket_allowed, remaining, capacity, rate, retry_after, near_limit = (
        _ADMISSION.unpack_from(reply, at)
    )
    bucket = None
    if bucket_allowed >= 0:
        bucket = BucketVerdict(
            allowed=bucket_allowed == 1,
            remaining=remaining,
            capacity=capacity,
            rate=rate,
            retry_after=retry_after,
            near_limit=near_limit == 1,
        )
    velocity = _velocity_of(op, reply, at + _ADMISSION.size)
    return AdmitVerdict(allowed=allowed == 1, velocity=velocity, bucket=bucket)


def _velocity_verdict(op: Gate | Record | RecordBatch, reply: Any) -> VelocityVerdict:
    verdict = _velocity_of(op, _packed(op, reply))
    if verdict is None:  # these scripts always decide
        raise _unreadable(op, reply)
    return verdict


def _admit_verdict(op: Admit, reply: Any) -> AdmitVerdict:
    return _admission_of(op, _packed(op, reply))


def _lease_verdict(op: Lease, reply: Any) -> LeaseVerdict:
    trip_at = _LEASE_HEAD.size
    admission_at = trip_at + _VELOCITY_VERDICT.size
    if len(_packed(op, reply)) < admission_at:
        raise _unreadable(op, reply)
    (granted,) = _LEASE_HEAD.unpack_from(reply)
    tripped = _velocity_of(op, reply[:admission_at], trip_at)
    return LeaseVerdict(_admission_of(op, reply, admission_at), granted, tripped)


def _first_trip(op: ReturnLease, reply: Any) -> VelocityVerdict | None:
    return _velocity_of(op, _packed(op, reply))


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


def _loop_verdict(op: CheckLoops | NoteLoop, reply: bytes | str) -> LoopVerdict:
    return loop_verdict_of(reply)


def _loop_verdicts(op: NoteLoopBatch, reply: Sequence[bytes | str]) -> list[LoopVerdict]:
    # '' is a note that found nothing to say: the empty verdict (most notes of a batch)
    return [loop_verdict_of(each) if each else LoopVerdict() for each in reply]


def loop_verdict_of(reply: bytes | str) -> LoopVerdict:
    """A ``LoopVerdict`` from the scripts' 10 fields ('allowed reason tripped repeated count
    window retry_after failures status error'): a reply, or a trip's announcement."""
    allowed, reason, tripped, repeated, count, window, retry_after, failures, status, error = (
        reply.split()
    )
    text = error.decode("ascii") if isinstance(error, bytes) else error
    return LoopVerdict(
        allowed=int(allowed) == 1,
        reason=LOOP_REASONS.get(int(reason)),
        tripped=int(tripped) == 1,
        repeated=int(repeated) == 1,
        count=float(count),
        window=float(window),
        retry_after=float(retry_after),
        failures=float(failures),
        status=float(status),
        error="" if text == "-" else text,
    )


def _forgotten(op: ForgetLoops, reply: Any) -> int:
    return int(reply)


_RUN_UNITS = {0: None, 1: "tokens", 2: "usd"}


def run_state(fields: Sequence[Any]) -> RunState:
    """The core's run state from its nine numbers (``RUN_LAYOUT``)."""
    return RunState(*(float(text) for text in fields))


def _run_verdict(op: OpenRun | Reserve | Settle, reply: bytes | str) -> RunVerdict:
    fields = reply.split()
    return RunVerdict(
        allowed=int(fields[0]) == 1,
        unit=_RUN_UNITS[int(fields[1])],
        near=int(fields[2]) == 1,
        exceeded=int(fields[3]) == 1,
        state=run_state(fields[4:]),
    )


def _run_read(op: ReadRun, reply: bytes | str) -> RunState | None:
    fields = reply.split()
    return run_state(fields) if fields else None


def _nothing(op: Reset | Forgive | Configure, reply: object) -> None:
    return None


# -- one codec per operation ----------------------------------------------------------------------

Key = Callable[[str, str], str]
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
    key: Key = key_of
    """The Redis key the script works on, from the store's prefix and the operation's key."""


#: Every operation ``RedisStore`` runs, with its codec; ``redis_scripts`` loads their scripts.
CODECS: dict[type[Op[Any]], Codec[Any, Any]] = {
    Gate: Codec(_now_only, _velocity_verdict),
    Record: Codec(_record_args, _velocity_verdict),
    RecordBatch: Codec(_record_batch_args, _velocity_verdict),
    Admit: Codec(_admit_args, _admit_verdict),
    Lease: Codec(_lease_args, _lease_verdict),
    ReturnLease: Codec(_return_lease_args, _first_trip),
    ReadStatus: Codec(_now_only, _status),
    ReadState: Codec(_now_only, _key_state),
    Reset: Codec(_ttl_only, _nothing),
    Forgive: Codec(_ttl_only, _nothing),
    Configure: Codec(_configure_args, _nothing),
    CheckLoops: Codec(_check_loops_args, _loop_verdict, loops_key_of),
    NoteLoop: Codec(_note_loop_args, _loop_verdict, loops_key_of),
    NoteLoopBatch: Codec(_note_loop_batch_args, _loop_verdicts, loops_key_of),
    ForgetLoops: Codec(_forget_loops_args, _forgotten, loops_key_of),
    OpenRun: Codec(_open_run_args, _run_verdict),
    Reserve: Codec(_reserve_args, _run_verdict),
    Settle: Codec(_settle_args, _run_verdict),
    ReadRun: Codec(_read_run_args, _run_read),
}
