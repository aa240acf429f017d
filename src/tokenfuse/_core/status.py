"""A key's status: what its state says right now, read without changing anything.

Every store answers ``status`` with ``status_of`` applied to the key's states, so the view is
the core's own arithmetic whichever store holds them (``RedisStore`` reads the raw state with
one script and decodes it into the same state objects).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import bucket as _bucket
from . import velocity as _velocity
from .bucket import BucketPolicy, BucketState
from .velocity import VelocityPolicy, VelocityState

__all__ = ["Status", "status_of"]


@dataclass(frozen=True, slots=True)
class Status:
    """What a fuse knows about one key right now (``Fuse.status``).

    >>> fuse = Fuse()                                   # doctest: +SKIP
    >>> fuse.record("agent-42", 1_200).allowed          # doctest: +SKIP
    True
    >>> status = fuse.status("agent-42")                # doctest: +SKIP
    >>> (status.rate, status.baseline, status.samples)  # doctest: +SKIP
    (1200.0, None, 0)

    A key the store has never seen reads as the defaults: no rate, no baseline, closed.
    """

    key: str
    """The key's label, as events and refusals show it (a redacted credential or the name it
    was given). A store asked directly puts the storage key it was asked about here."""
    key_id: str | None = None
    """The key's short, non-secret id (``Fuse.key_id``), as refusals and events show it next
    to the label; None from a store asked directly."""
    rate: float = 0.0
    """What the key spent in the last 60 s, in the velocity policy's unit per minute."""
    baseline: float | None = None
    """The baseline the spike check uses: ``learned_baseline`` once it is established (see
    ``established``), None until then. A rate of ``spike_multiple`` times it is a loop."""
    learned_baseline: float = 0.0
    """The raw estimate so far, established or not: the time-weighted mean of the key's learned
    active minutes (0 before the first is learned)."""
    samples: int = 0
    """Active minutes learned into the baseline (not decayed)."""
    established: bool = False
    """Whether the baseline counts: the key was first seen ``learning_period`` ago and has
    ``min_samples`` learned minutes. Until then the cold-start ceiling applies instead."""
    open_until: float | None = None
    """While the key is open (refusing every call after a trip): when it closes, in epoch
    seconds on the store's clock (the Redis server's ``TIME`` for a ``RedisStore`` without a
    ``clock``). None while the key is closed."""
    limit: float | None = None
    """The manual ceiling per minute in force: the key's live override (``Fuse.set_limit``),
    else the policy's ``limit``. None when there is none, or the key has no velocity state."""
    bucket_level: float | None = None
    """Tokens in the key's bucket now; None when the fuse has no bucket or the key has not
    used it yet (its first call will find it full)."""
    bucket_capacity: float | None = None
    """The bucket's capacity in force (a live override wins); None without a bucket."""
    bucket_rate: float | None = None
    """The bucket's refill per second in force (a live override wins); None without a bucket."""
    first_seen: float | None = None
    """When the key was first recorded, epoch seconds on the store's clock; None when it has
    no velocity state (never recorded)."""


def status_of(
    key: str,
    velocity_state: VelocityState | None,
    bucket_state: BucketState | None,
    now: float,
    velocity: VelocityPolicy,
    bucket: BucketPolicy | None,
) -> Status:
    """The status of a key with these states (None: the key has none) at ``now``."""
    capacity = rate = level = None
    if bucket is not None:
        capacity, rate = bucket.capacity, bucket.rate
        if bucket_state is not None:
            capacity, rate = _bucket.limits_of(bucket_state, bucket)
            level = _bucket.level(bucket_state, now, capacity, rate)
    state = velocity_state
    if state is None:
        return Status(key=key, bucket_level=level, bucket_capacity=capacity, bucket_rate=rate)
    established = _velocity.established(state, now, velocity)
    return Status(
        key=key,
        rate=_velocity.rate_at(state, now),
        baseline=state.baseline if established else None,
        learned_baseline=state.baseline,
        samples=state.samples,
        established=established,
        open_until=state.open_until if state.open_until > now else None,
        limit=_velocity.manual_ceiling(state, velocity),
        bucket_level=level,
        bucket_capacity=capacity,
        bucket_rate=rate,
        first_seen=state.first_seen,
    )
