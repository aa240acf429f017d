"""Inbound: the defaults — what ``app.add_middleware(TokenFuse)`` with no arguments enforces.

* **Bucket**: the ``FREE`` tier, 10 calls/s refill with a burst of 50, per caller.
* **Velocity** (``CALL_VELOCITY``), counting calls per caller with the rules of
  ``docs/detection.md``, each against the caller's own normal once its baseline is
  established (first seen ``learning_period=1 day`` ago, ``min_samples=30`` active minutes)
  and meaningful (``min_baseline=5`` calls/min):

  - no manual ceiling (``limit=None``; set one in code or live with ``Fuse.set_limit``);
  - ``loop_suspected``: ``spike_multiple=10`` times the caller's normal in the sliding 60 s
    window (at least 50 calls in a minute), the normal being its baseline or, for a bursty
    caller, 0.9 times the root mean square of its minutes (``rms_share``);
  - ``loop_early``: the early check (``early_threshold=12``) refuses a caller that keeps
    calling beyond 10 times its usual pace within seconds, before the 60 s window fills;
  - ``loop_sustained``: ten minutes at 7.5 times its average with idle time and 6 times its
    normal (``sustained_multiple``, ``sustained_baseline_multiple``);
  - ``loop_sparse`` counts calls of one unit each, so it never fires here;
  - no cold-start ceiling (``cold_start_limit=None``, hence no cold-start budget and no
    ceiling of a caller's own, ``baseline_ceiling``): until a baseline exists, the bucket is
    the containment, so a client that paces itself by the ``RateLimit`` headers is never
    refused by a second, hidden limit;
  - ``VelocityPolicy``'s default latch: 60 s cooldown after a trip, doubling for repeated
    trips within an hour, capped at one hour ("Latch" in ``docs/design.md``); the baseline
    half-life is one day ("Baseline estimator" there).
"""

from __future__ import annotations

from collections.abc import Iterable

from .._core.bucket import FREE, BucketPolicy
from .._core.velocity import VelocityPolicy
from .._events import Hook
from .._fuse import Fuse
from .._stores.base import AsyncStore, SyncStore

__all__ = ["CALL_VELOCITY", "default_inbound_fuse", "inbound_fuse"]

CALL_VELOCITY = VelocityPolicy(
    unit="calls",
    limit=None,
    spike_multiple=10.0,
    min_baseline=5.0,
    learning_period=86_400.0,
    min_samples=30,
    cold_start_limit=None,
    half_life=86_400.0,
)


def inbound_fuse(
    store: SyncStore | AsyncStore | None = None,
    *,
    bucket: BucketPolicy | None = FREE,
    velocity: VelocityPolicy | None = CALL_VELOCITY,
    name: str = "inbound",
    fail_closed: bool = False,
    on_event: Hook | Iterable[Hook] | None = None,
) -> Fuse:
    """A ``Fuse`` with the inbound defaults, for ``TokenFuse(fuse=...)``.

    >>> from tokenfuse import STARTER
    >>> fuse = inbound_fuse(bucket=STARTER)          # MemoryStore; or RedisStore.from_url(...)
    """
    return Fuse(
        store,
        name=name,
        velocity=velocity,
        bucket=bucket,
        fail_closed=fail_closed,
        on_event=on_event,
    )


def default_inbound_fuse() -> Fuse:
    """The process-wide inbound fuse: the defaults above (or what the ``TOKENFUSE_*``
    environment or ``tokenfuse.configure`` set) on the store the argument-less transport uses
    too (its keys live under their own name, ``inbound``)."""
    from .._settings import default_fuses

    return default_fuses()[1]
