"""Inbound admission: one decision over a caller's latch, bucket and velocity, in that order.

The order matters: an open key takes nothing from its bucket, and a call its bucket refuses
adds nothing to its velocity window (refused calls are not spending).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import bucket as _bucket
from . import velocity as _velocity
from .bucket import BucketPolicy, BucketState, BucketVerdict
from .velocity import VelocityPolicy, VelocityState, VelocityVerdict

__all__ = ["AdmitVerdict", "admit"]


# Not frozen: built on every guarded call, and frozen dataclasses pay a setattr per field.
@dataclass(slots=True)
class AdmitVerdict:
    """``velocity`` is None without a velocity policy; ``bucket`` is None without a bucket
    policy or when the latch refused first."""

    allowed: bool
    velocity: VelocityVerdict | None
    bucket: BucketVerdict | None


def admit(
    velocity_state: VelocityState | None,
    bucket_state: BucketState | None,
    *,
    cost: float,
    amount: float,
    now: float,
    velocity: VelocityPolicy | None,
    bucket: BucketPolicy | None,
) -> AdmitVerdict:
    """Decide one inbound call. States are given when their policy is (created by the store)."""
    latch: VelocityVerdict | None = None
    if velocity is not None and velocity_state is not None:
        latch = _velocity.gate(velocity_state, now)
        if not latch.allowed:
            return AdmitVerdict(allowed=False, velocity=latch, bucket=None)
    taken: BucketVerdict | None = None
    if bucket is not None and bucket_state is not None:
        taken = _bucket.consume(bucket_state, cost, now, bucket)
        if not taken.allowed:
            return AdmitVerdict(allowed=False, velocity=latch, bucket=taken)
    if velocity is not None and velocity_state is not None and amount > 0:
        latch = _velocity.record(velocity_state, amount, now, velocity)
    return AdmitVerdict(allowed=latch is None or latch.allowed, velocity=latch, bucket=taken)
