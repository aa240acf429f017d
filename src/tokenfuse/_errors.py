"""The exceptions tokenfuse raises, under one root.

::

    TokenFuseError
    ├── FuseTripped            a refusal: the key is over a limit or its fuse is open
    │   ├── LoopSuspected      rate >= spike_multiple x the key's own baseline
    │   ├── CeilingExceeded    rate above a manual or cold-start per-minute ceiling
    │   └── QuotaExhausted     the caller's token bucket is empty
    ├── StoreUnavailable       the store failed and the fuse was told to fail closed
    │   └── StoreBusy          only this process's connection pool was full (back-pressure)
    └── ConfigurationError     also a ``ValueError``: bad options, caught at construction

Every refusal carries the numbers that explain it, so the message a user reads says what
happened, not merely that a limit exists.
"""

from __future__ import annotations

__all__ = [
    "CeilingExceeded",
    "ConfigurationError",
    "FuseTripped",
    "LoopSuspected",
    "QuotaExhausted",
    "StoreBusy",
    "StoreUnavailable",
    "TokenFuseError",
]


class TokenFuseError(Exception):
    """Root of every exception tokenfuse raises."""


class ConfigurationError(TokenFuseError, ValueError):
    """An option is invalid (a rate string that does not parse, a negative capacity, ...)."""


class StoreUnavailable(TokenFuseError):
    """The store could not be reached and the fuse was told to fail closed."""


class StoreBusy(StoreUnavailable):
    """The store answers, but no pooled connection came free within the decision's budget.

    Back-pressure inside this process, not an outage: it never makes the fuse back off.
    """


def _fmt(value: float) -> str:
    """Counts read best without decimals once they are large: ``3,150`` not ``3150.0``."""
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:,.1f}"


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 1 else f"{value:.2f} s"


class FuseTripped(TokenFuseError):
    """A call was refused. Base of every refusal.

    Attributes:
        key: redacted label of the identity (``sk-…a1b2``), never a raw credential.
        key_id: the identity's short, non-secret id (``3f9a0c12d4e5``), which tells apart
            keys whose labels look alike and names the key to admin tools; None when unknown.
        reason: machine-readable code (``loop_suspected``, ``manual_ceiling``,
            ``cold_start_ceiling``, ``quota_exhausted``).
        rate: the amount in the last 60 s (velocity) or the bucket level (quota).
        limit: the threshold that was crossed, in the same unit as ``rate``.
        baseline: the key's learned per-active-minute baseline, ``None`` when not established.
        multiple: ``rate / baseline`` for a spike, ``None`` when not applicable.
        retry_after: seconds until a call from this key can succeed again.
        unit: what is counted (``tokens``, ``calls``, ...).
    """

    reason: str = "tripped"
    key_id: str | None = None

    def __init__(
        self,
        *,
        key: str,
        rate: float,
        limit: float,
        retry_after: float,
        baseline: float | None = None,
        multiple: float | None = None,
        unit: str = "tokens",
        reason: str | None = None,
        key_id: str | None = None,
    ) -> None:
        self.key = key
        self.key_id = key_id
        self.rate = rate
        self.limit = limit
        self.retry_after = retry_after
        self.baseline = baseline
        self.multiple = multiple
        self.unit = unit
        if reason is not None:
            self.reason = reason
        super().__init__(self.describe())

    @property
    def who(self) -> str:
        """The key as messages name it: its label and, when known, its id.

        >>> FuseTripped(key="sk-…a1b2", key_id="3f9a0c12d4e5", rate=1, limit=1, retry_after=1).who
        'sk-…a1b2 [id 3f9a0c12d4e5]'
        """
        return f"{self.key} [id {self.key_id}]" if self.key_id else self.key

    def describe(self) -> str:
        """The human sentence; subclasses say what the numbers mean."""
        return (
            f"limit reached for key {self.who}: {_fmt(self.rate)} {self.unit}, over the limit of "
            f"{_fmt(self.limit)} (retry in {_seconds(self.retry_after)})"
        )

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready view, used by the middleware's 429 body and by event hooks."""
        return {
            "type": self.reason,
            "message": str(self),
            "key": self.key,
            "key_id": self.key_id,
            "unit": self.unit,
            "rate": self.rate,
            "limit": self.limit,
            "baseline": self.baseline,
            "multiple": self.multiple,
            "retry_after": self.retry_after,
        }

    def __reduce__(self) -> tuple[object, ...]:
        return reduce_as(self, type(self))


def reduce_as(error: FuseTripped, kind: type[FuseTripped]) -> tuple[object, ...]:
    """``error.__reduce__()`` that unpickles as a ``kind``.

    A keyword-only ``__init__`` needs help to survive pickling (multiprocessing, Celery); a
    refusal class made at run time (the transport's, for the SDKs) pickles as its plain one.
    """
    return (_rebuild, (kind, error.__dict__.copy()))


def _rebuild(cls: type[FuseTripped], state: dict[str, object]) -> FuseTripped:
    error = cls.__new__(cls)
    error.__dict__.update(state)
    Exception.__init__(error, error.describe())
    return error


class LoopSuspected(FuseTripped):
    """The key's rate is ``multiple`` times its own baseline: a loop or a retry storm."""

    reason = "loop_suspected"

    def describe(self) -> str:
        multiple = f"{self.multiple:.1f}x" if self.multiple is not None else "far above"
        baseline = _fmt(self.baseline) if self.baseline is not None else "?"
        return (
            f"possible agent loop or retry storm: {_fmt(self.rate)} {self.unit}/min is "
            f"{multiple} the baseline of {baseline} {self.unit}/min for key {self.who} "
            f"(blocked for {_seconds(self.retry_after)})"
        )


class CeilingExceeded(FuseTripped):
    """The key's rate went over a per-minute ceiling (manual, or the cold-start safety net)."""

    reason = "manual_ceiling"

    def describe(self) -> str:
        which = "cold-start ceiling" if self.reason == "cold_start_ceiling" else "ceiling"
        return (
            f"rate over the {which}: {_fmt(self.rate)} {self.unit}/min is above "
            f"{_fmt(self.limit)} {self.unit}/min for key {self.who} "
            f"(blocked for {_seconds(self.retry_after)})"
        )


class QuotaExhausted(FuseTripped):
    """The caller's token bucket cannot pay for this call yet.

    The bucket's numbers map onto the common fields as ``rate`` = refill rate per second and
    ``limit`` = capacity.
    """

    reason = "quota_exhausted"

    def describe(self) -> str:
        return (
            f"call quota exhausted for key {self.who}: the bucket of {_fmt(self.limit)} "
            f"{self.unit} refills at {_fmt(self.rate)}/s (retry in {_seconds(self.retry_after)})"
        )
