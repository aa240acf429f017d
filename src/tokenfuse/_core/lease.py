"""Leases: a process takes a slice of a hot bucket's tokens and admits calls from it locally
(docs/design.md, "Leases").

A hot bucket (hundreds to thousands of calls a second for one caller, across processes) costs
a store round trip per call in the direct mode. With a lease, the call that finds its process
without tokens asks the store for its own cost *plus* up to ``size`` more; the calls after it
spend those locally, with no round trip, until the lease is spent or ``lifetime`` has passed.
What is left then goes back to the bucket, together with the velocity amounts of the calls
admitted locally (recorded in the store in order, as ``RecordBatch`` records them).

**The bound.** A lease only ever spends tokens the bucket gave it, so the bucket itself never
goes below zero. What a lease changes is *when* a token is spent: up to ``lifetime`` after the
bucket let it go. So, for one caller, the cost admitted by all processes together in any
interval of ``T`` seconds is at most

    capacity + rate * T + processes * largest

where ``largest`` is ``LeasePolicy.largest`` (the fixed ``size``, or ``max_size``): at any
moment a process holds at most that many tokens it has not spent. The direct mode's bound is
the same without the last term. Tokens given back to a full bucket are dropped, never added
above its capacity; tokens of a process that dies are lost (fewer calls admitted, never more).

Pure, like the rest of ``_core``: the store side (``grant``, ``settle``) is mirrored in Lua
(``lua/lease.lua``, ``lua/return_lease.lua``); the process side (``LocalLease``, ``spend``,
``next_size``) runs in ``tokenfuse._leases``, which adds the locks and the I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .._errors import ConfigurationError
from . import bucket as _bucket
from . import velocity as _velocity
from .admission import AdmitVerdict, admit
from .bucket import BucketPolicy, BucketState
from .velocity import VelocityPolicy, VelocityState, VelocityVerdict

__all__ = [
    "MAX_PENDING",
    "LeasePolicy",
    "LeaseVerdict",
    "LocalLease",
    "grant",
    "next_size",
    "settle",
    "spend",
    "wants_top_up",
]

#: The most velocity amounts a lease keeps before it must be renewed: they travel to the
#: store as the arguments of one script call.
MAX_PENDING = 1_000


def _positive(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{what} must be a positive number, not {value!r}")
    if not (math.isfinite(value) and value > 0):
        raise ConfigurationError(f"{what} must be a positive number, not {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True, init=False)
class LeasePolicy:
    """How large and how long-lived the leases of one ``TokenFuse`` are.

    Attributes:
        size: tokens a lease takes beyond the cost of the call that takes it; ``None`` (the
            default) adapts it to this process's rate for the caller: ``cover`` seconds of
            it, at least 1, at most ``max_size``.
        max_size: the largest adaptive lease.
        cover: seconds of the observed rate an adaptive lease covers (0.1: a busy caller
            costs about ten round trips a second per process, whatever its rate).
        lifetime: seconds a lease may be spent; then what is left goes back.
        wait: seconds a call waits for another call of the same caller that is renewing the
            lease, before it is decided directly (one ``Admit``) instead.
        max_keys: leases held at once per process; the callers beyond are decided directly.
        top_up: asyncio callers only: once three quarters of a lease are spent, top it up in
            the background
            (one ``Lease`` round trip off the callers' path), so that a busy caller's calls
            rarely wait for a renewal. Sync callers renew when the lease runs out.

    >>> LeasePolicy(size=20).largest
    20.0
    """

    size: float | None
    max_size: float
    cover: float
    lifetime: float
    wait: float
    max_keys: int
    top_up: bool

    def __init__(
        self,
        *,
        size: float | None = None,
        max_size: float = 100.0,
        cover: float = 0.1,
        lifetime: float = 1.0,
        wait: float = 0.05,
        max_keys: int = 10_000,
        top_up: bool = True,
    ) -> None:
        put = object.__setattr__
        put(self, "size", None if size is None else _positive(size, "lease size"))
        put(self, "max_size", _positive(max_size, "lease max_size"))
        put(self, "cover", _positive(cover, "lease cover"))
        put(self, "lifetime", _positive(lifetime, "lease lifetime"))
        put(self, "wait", float(wait) if wait >= 0 else _positive(wait, "lease wait"))
        if not (isinstance(max_keys, int) and max_keys >= 1):
            raise ConfigurationError(f"lease max_keys must be at least 1, not {max_keys!r}")
        put(self, "max_keys", max_keys)
        put(self, "top_up", bool(top_up))

    @property
    def largest(self) -> float:
        """The most unspent tokens one process holds for one caller: the bound's term."""
        return self.size if self.size is not None else self.max_size

    def bound(self, processes: int) -> float:
        """Cost that may be admitted beyond ``capacity + rate * T`` in any ``T`` seconds."""
        return processes * self.largest


@dataclass(slots=True)
class LocalLease:
    """What one process holds of one caller's bucket."""

    policy: BucketPolicy  # the bucket policy it was taken under: another one renews it
    tokens: float  # left to spend here
    expires: float  # on this process's clock: not spent from at or after it
    started: float
    capacity: float  # the limits in force at the store when it was taken (for the headers)
    rate: float
    remaining: float  # what the bucket held right after the grant
    size: float  # what it asked for beyond its first call's cost
    spent: float = 0.0  # cost admitted from it since it was taken
    pending: list[float] = field(default_factory=list)  # velocity amounts not yet recorded
    topped: bool = False  # a top-up was asked for (at most one per lease)


def spend(lease: LocalLease, cost: float, amount: float, now: float) -> bool:
    """Admit one call from the lease if it can: not expired, ``cost`` left, room for its
    velocity amount. False: the lease must be renewed first."""
    if now >= lease.expires or lease.tokens < cost - _bucket._EPSILON:
        return False
    if amount > 0.0:
        if len(lease.pending) >= MAX_PENDING:
            return False
        lease.pending.append(amount)
    lease.tokens = max(lease.tokens - cost, 0.0)
    lease.spent += cost
    return True


def wants_top_up(lease: LocalLease) -> bool:
    """Whether to top the lease up in the background now (asyncio callers): three quarters
    of it are spent and it has not been topped up yet. A top-up asks for ``next_size`` minus
    what the lease still holds, so a process never holds more than ``LeasePolicy.largest``."""
    return not lease.topped and lease.tokens < lease.size / 4


def next_size(lease: LocalLease | None, policy: LeasePolicy, now: float) -> float:
    """Tokens the next lease asks for beyond its first call's cost: the fixed size, or
    ``cover`` seconds of the rate the previous lease was spent at (1 for a first lease)."""
    if policy.size is not None:
        return policy.size
    if lease is None:
        return 1.0
    rate = lease.spent / max(now - lease.started, 1e-3)
    return min(max(rate * policy.cover, 1.0), policy.max_size)


# -- the store's side: one step each, mirrored by lua/lease.lua and lua/return_lease.lua ------


# Not frozen: built on every lease, and frozen dataclasses pay a setattr per field.
@dataclass(slots=True)
class LeaseVerdict:
    """``admit``: the decision on the call that took the lease (as ``Admit``'s); ``granted``:
    the tokens taken for the lease beyond its cost (0 when refused); ``tripped``: the first
    trip of the amounts recorded for the calls the previous lease admitted, or None."""

    admit: AdmitVerdict
    granted: float
    tripped: VelocityVerdict | None


def settle(
    velocity_state: VelocityState | None,
    bucket_state: BucketState | None,
    *,
    give_back: float,
    pending: tuple[float, ...],
    now: float,
    velocity: VelocityPolicy | None,
    bucket: BucketPolicy | None,
) -> VelocityVerdict | None:
    """Close a lease: give its unspent tokens back, then record the velocity amounts of the
    calls it admitted, in order. Returns the first trip among them, or None."""
    if bucket is not None and bucket_state is not None and give_back > 0.0:
        _bucket.give_back(bucket_state, give_back, now, bucket)
    tripped = None
    if velocity is not None and velocity_state is not None:
        for amount in pending:
            verdict = _velocity.record(velocity_state, amount, now, velocity)
            if verdict.tripped and tripped is None:
                tripped = verdict
    return tripped


def grant(
    velocity_state: VelocityState | None,
    bucket_state: BucketState | None,
    *,
    cost: float,
    amount: float,
    want: float,
    give_back: float,
    pending: tuple[float, ...],
    now: float,
    velocity: VelocityPolicy | None,
    bucket: BucketPolicy | None,
) -> LeaseVerdict:
    """Renew a lease: ``settle`` the previous one, decide the call that renews it exactly as
    ``admission.admit`` would, and if it is allowed take up to ``want`` more tokens for the
    new lease (what the bucket holds, no more)."""
    tripped = settle(
        velocity_state,
        bucket_state,
        give_back=give_back,
        pending=pending,
        now=now,
        velocity=velocity,
        bucket=bucket,
    )
    verdict = admit(
        velocity_state,
        bucket_state,
        cost=cost,
        amount=amount,
        now=now,
        velocity=velocity,
        bucket=bucket,
    )
    granted = 0.0
    if verdict.allowed and bucket is not None and bucket_state is not None and want > 0.0:
        granted = _bucket.take_more(bucket_state, want, now, bucket)
        if verdict.bucket is not None:
            verdict.bucket.remaining = bucket_state.tokens
    return LeaseVerdict(verdict, granted, tripped)
