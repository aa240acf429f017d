"""What an operator sees of a key: its status read against its fuse's policy.

``KeyView`` adds to a ``Status`` what a table of keys shows: the key id, the threshold the key
is judged against now, the rate as a multiple of its baseline, how full its bucket is, and one
word for its state. The threshold is the core's decision order read backwards: the manual
ceiling if one is set, and the spike threshold (``spike_multiple`` x an established baseline of
at least ``min_baseline``) or else the cold-start ceiling, whichever is lower.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .._core.status import Status
from .._core.velocity import VelocityPolicy
from .._identity import KEY_ID_LENGTH

__all__ = ["NEAR", "SORTS", "STATES", "KeyState", "KeyView", "threshold_of"]

KeyState = Literal["open", "near", "ok", "idle"]

#: A key at this share of its threshold, or with this share of its bucket left, is "near".
NEAR = 0.8

#: The states, the most urgent first.
STATES: tuple[KeyState, ...] = ("open", "near", "ok", "idle")
#: What a table of keys can be sorted by (``KeyView.sort_key``).
SORTS = ("rate", "multiple", "baseline", "bucket", "state")
_ORDER = {state: rank for rank, state in enumerate(STATES)}


def threshold_of(status: Status, policy: VelocityPolicy | None) -> float | None:
    """The rate per minute at which the key's next record would trip, or None (no ceiling)."""
    if policy is None:
        return None
    found = []
    if status.limit is not None:
        found.append(status.limit)
    baseline = status.baseline
    if baseline is not None and baseline >= policy.min_baseline:
        found.append(policy.spike_multiple * baseline)
    elif policy.cold_start_limit is not None:
        found.append(policy.cold_start_limit)
    return min(found) if found else None


@dataclass(frozen=True, slots=True)
class KeyView:
    """One key of one fuse, as the CLI and the admin app show it.

    ``label`` is the key's readable label when it is known (a name, or a credential's redaction
    seen in an event), else None: the store keeps only keyed hashes.
    """

    fuse: str
    key_id: str
    label: str | None
    status: Status
    threshold: float | None
    unit: str = "tokens"

    @classmethod
    def of(
        cls, fuse: str, status: Status, policy: VelocityPolicy | None, label: str | None = None
    ) -> KeyView:
        """The view of ``status``: a fuse's (its key id set), or a store's (its ``key`` the
        store key, ``<fuse>:<keyed hash>``, whose start is the key id)."""
        key_id = status.key_id or status.key.partition(":")[2][:KEY_ID_LENGTH]
        return cls(
            fuse=fuse,
            key_id=key_id,
            label=label,
            status=status,
            threshold=threshold_of(status, policy),
            unit=policy.unit if policy is not None else "tokens",
        )

    @property
    def multiple(self) -> float | None:
        """The rate over the established baseline (None until the baseline counts)."""
        baseline = self.status.baseline
        return self.status.rate / baseline if baseline else None

    @property
    def bucket_fill(self) -> float | None:
        """The share of its bucket the key has left (0..1); None without a bucket."""
        level, capacity = self.status.bucket_level, self.status.bucket_capacity
        if capacity is None:
            return None
        return 1.0 if level is None else level / capacity

    @property
    def state(self) -> KeyState:
        """``open`` (refusing), ``near`` (close to its threshold or its bucket's end), ``ok``
        or ``idle`` (nothing in the last minute)."""
        status = self.status
        if status.open_until is not None:
            return "open"
        fill = self.bucket_fill
        hot = self.threshold is not None and status.rate >= NEAR * self.threshold
        if hot or (fill is not None and fill <= 1 - NEAR):
            return "near"
        return "ok" if status.rate > 0 else "idle"

    def sort_key(self, by: str) -> tuple[float, ...]:
        """For a table: by ``rate``, ``multiple``, ``baseline``, ``bucket`` (emptiest first)
        or ``state`` (open first, then by rate); largest first."""
        status = self.status
        if by == "state":
            return (_ORDER[self.state], -status.rate)
        if by == "multiple":
            return (-(self.multiple or 0.0), -status.rate)
        if by == "baseline":
            return (-(status.baseline or status.learned_baseline), -status.rate)
        if by == "bucket":
            fill = self.bucket_fill
            return (2.0 if fill is None else fill, -status.rate)
        return (-status.rate,)

    def as_dict(self) -> dict[str, object]:
        """The view as JSON-ready data (``--json``, the admin API): no secret in it."""
        status = self.status
        return {
            "fuse": self.fuse,
            "key_id": self.key_id,
            "label": self.label,
            "state": self.state,
            "unit": self.unit,
            "rate": status.rate,
            "baseline": status.baseline,
            "learned_baseline": status.learned_baseline,
            "samples": status.samples,
            "established": status.established,
            "multiple": self.multiple,
            "threshold": self.threshold,
            "limit": status.limit,
            "open_until": status.open_until,
            "first_seen": status.first_seen,
            "bucket_level": status.bucket_level,
            "bucket_capacity": status.bucket_capacity,
            "bucket_rate": status.bucket_rate,
        }
