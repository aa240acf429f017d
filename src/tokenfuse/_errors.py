"""The exceptions tokenfuse raises, under one root.

::

    TokenFuseError
    ├── FuseTripped            a refusal: the key is over a limit or its fuse is open
    │   ├── LoopSuspected      the key's rate is far above its own normal (``loop_*``)
    │   ├── CeilingExceeded    rate above a manual, cold-start or the key's own ceiling
    │   ├── QuotaExhausted     the caller's token bucket is empty
    │   ├── FailureLoop        the same call keeps failing (or repeating): a stuck agent
    │   └── BudgetExceeded     the call would take its run past the run's budget
    ├── StoreUnavailable       the store failed and the fuse was told to fail closed
    │   └── StoreBusy          only this process's connection pool was full (back-pressure)
    └── ConfigurationError     also a ``ValueError``: bad options, caught at construction

Every refusal carries the numbers that explain it, so the message a user reads says what
happened, not merely that a limit exists.
"""

from __future__ import annotations

__all__ = [
    "BudgetExceeded",
    "CeilingExceeded",
    "ConfigurationError",
    "FailureLoop",
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
        reason: machine-readable code, naming the rule that fired (``loop_suspected``,
            ``loop_early``, ``loop_sparse``, ``loop_sustained``, ``manual_ceiling``,
            ``baseline_ceiling``, ``cold_start_ceiling``, ``cold_start_budget``,
            ``quota_exhausted``; ``docs/detection.md`` describes each).
        rate: the rate per minute over ``window`` (velocity), or the refill rate (quota).
        limit: the threshold that was crossed, in the same unit as ``rate``.
        baseline: what the rule judged against: the key's baseline per active minute (its
            average with idle time included for ``loop_sustained``), ``None`` when not known.
        multiple: ``rate / baseline`` for the ``loop_*`` rules and ``baseline_ceiling``.
        retry_after: seconds until a call from this key can succeed again.
        unit: what is counted (``tokens``, ``calls``, ...).
        window: seconds the rate was measured over (``None`` for a quota).
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
        window: float | None = None,
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
        self.window = window
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
            "window": self.window,
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
    """The key's rate is ``multiple`` times its own normal: a loop or a retry storm."""

    reason = "loop_suspected"

    def describe(self) -> str:
        multiple = f"{self.multiple:.1f}x" if self.multiple is not None else "far above"
        baseline = _fmt(self.baseline) if self.baseline is not None else "?"
        normal = _NORMAL.get(self.reason, "the baseline")
        return (
            f"possible agent loop or retry storm: {_fmt(self.rate)} {self.unit}/min"
            f"{_over(self.window)} is {multiple} {normal} of {baseline} {self.unit}/min for key "
            f"{self.who}{_RULES.get(self.reason, '')} (blocked for {_seconds(self.retry_after)})"
        )


# What each loop rule compares against, and what it adds to the message.
_NORMAL = {"loop_sustained": "the average (idle time included)"}
_RULES = {
    "loop_early": ", far more calls than its usual pace (early check)",
    "loop_sparse": ": large calls repeating",
    "loop_sustained": ", sustained",
}


def _over(window: float | None) -> str:
    if window is None:
        return ""
    return f" over {window / 60:.0f} min" if window >= 120 else f" over {_seconds(window)}"


class CeilingExceeded(FuseTripped):
    """The key's rate went over a ceiling: one set by hand, the cold-start safety net for keys
    without an established baseline, or an established key's own (``baseline_ceiling``)."""

    reason = "manual_ceiling"

    def describe(self) -> str:
        which, advice = _CEILINGS.get(self.reason, ("ceiling", ""))
        return (
            f"rate over the {which}: {_fmt(self.rate)} {self.unit}/min"
            f"{_over(self.window if self.reason != 'manual_ceiling' else None)} is above "
            f"{_fmt(self.limit)} {self.unit}/min for key {self.who} "
            f"(blocked for {_seconds(self.retry_after)}){advice}"
        )


_COLD_ADVICE = (
    "; the key has no established baseline yet. If this traffic is normal: "
    "fuse.forgive(key) allows it at this hour of day, fuse.set_limit(key, ...) sets this "
    "key's own ceiling, VelocityPolicy({option}=...) changes it for every new key"
)
_CEILINGS = {
    "cold_start_ceiling": ("cold-start ceiling", _COLD_ADVICE.format(option="cold_start_limit")),
    "cold_start_budget": (
        "cold-start budget",
        _COLD_ADVICE.format(option="cold_start_sustained"),
    ),
    "baseline_ceiling": (
        "key's own ceiling",
        "; the ceiling is the key's baseline times VelocityPolicy(ceiling_multiple=...)",
    ),
}


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


class FailureLoop(FuseTripped):
    """The same call kept failing, or kept being sent: the agent is stuck, so it is refused.

    ``reason`` says which loop: ``failure_loop`` (the same request failed ``count`` times
    within ``window`` seconds), ``repeat_loop`` (the same request was sent ``count`` times
    within ``window``, refused only when so configured), ``tool_loop`` (the conversation shows
    the model asking for the same failing tool call, or alternating between two, ``count``
    times). The common fields read ``rate`` = ``count`` and ``limit`` = the count that trips.

    Attributes:
        call: what was called, ``POST /v1/chat/completions #3f9a0c12`` (method, path and the
            start of the call's fingerprint, a keyed hash: never the body itself).
        fingerprint: the call's whole fingerprint (16 hex characters).
        tool: the tool (or the two tools, ``a/b``) the loop is about, when known.
        count: failures (or sends) counted.
        status: the HTTP status of the last failure, when there was one.
        error: the type of the last failure (``invalid_request_error``), at most 32 safe
            characters; never a message, which may quote the request.
        store_key: the identity's key in the store (a keyed hash, never the credential):
            ``tokenfuse.forget_loops(error)`` lets this very call through again.
    """

    reason = "failure_loop"

    def __init__(
        self,
        *,
        key: str,
        call: str,
        count: float,
        limit: float,
        window: float,
        retry_after: float,
        fingerprint: str = "",
        tool: str | None = None,
        status: int | None = None,
        error: str | None = None,
        reason: str | None = None,
        key_id: str | None = None,
        store_key: str | None = None,
    ) -> None:
        self.call = call
        self.fingerprint = fingerprint
        self.store_key = store_key
        self.tool = tool
        self.count = count
        self.status = status
        self.error = error
        super().__init__(
            key=key,
            rate=count,
            limit=limit,
            retry_after=retry_after,
            unit="calls",
            reason=reason,
            window=window,
            key_id=key_id,
        )

    @property
    def last_error(self) -> str:
        """``HTTP 400 invalid_request_error``, ``HTTP 500``, ``tool error``; '' when none."""
        parts = [f"HTTP {self.status}" if self.status else "", self.error or ""]
        return " ".join(part for part in parts if part)

    def describe(self) -> str:
        tool = f" (tool {self.tool})" if self.tool else ""
        last = f"; last error: {self.last_error}" if self.last_error else ""
        within = _over(self.window)
        if self.reason == "repeat_loop":
            what = f"repeat loop: {self.call}{tool} was sent {_fmt(self.count)} times{within}"
        elif self.reason == "tool_loop":
            what = (
                f"tool-call loop: the conversation sent to {self.call} shows the model asking "
                f"for the same failing tool call{tool} {_fmt(self.count)} times in a row"
            )
        else:
            what = f"failure loop: {self.call}{tool} failed {_fmt(self.count)} times{within}"
        if self.reason == "repeat_loop" and self.retry_after <= 0:
            advice = ' (reported, not refused: FailureLoopPolicy(on_repeat="refuse") refuses it)'
        elif self.reason == "tool_loop":
            advice = (
                "; the agent is stuck on a tool error: change the arguments, fix the tool, "
                "or stop the run"
            )
        else:
            advice = (
                f" (blocked for {_seconds(self.retry_after)}); the agent is stuck: change the "
                "request, or let it through now with tokenfuse.forget_loops(this error)"
            )
        return f"{what} for key {self.who}{last}{advice}"

    def as_dict(self) -> dict[str, object]:
        return {
            **super().as_dict(),
            "call": self.call,
            "fingerprint": self.fingerprint,
            "tool": self.tool,
            "count": self.count,
            "status": self.status,
            "error": self.error,
        }


class BudgetExceeded(FuseTripped):
    """The call would take its run (``tokenfuse.run``) past the run's budget: refused before
    a byte of it was sent.

    Attributes, beyond ``FuseTripped``'s (``key`` is the run id, ``rate`` what it spent):
        run_id: the run whose budget it is (the innermost refusing one when runs nest).
        spent: what the run's finished calls spent, in ``unit`` (``tokens`` or ``usd``).
        limit: the run's limit in that unit.
        reserved: what calls still in flight hold (they may spend it or give it back).
        requested: what this call would have reserved (its estimate).
        retry_after: seconds until the run's state expires, when its budget starts afresh:
            retrying sooner is refused the same way.
    """

    reason = "budget_exceeded"

    def __init__(
        self,
        *,
        run_id: str,
        spent: float,
        limit: float,
        unit: str,
        reserved: float,
        requested: float,
        retry_after: float,
    ) -> None:
        self.run_id = run_id
        self.spent = spent
        self.reserved = reserved
        self.requested = requested
        super().__init__(key=run_id, rate=spent, limit=limit, retry_after=retry_after, unit=unit)

    def describe(self) -> str:
        amount = _usd if self.unit == "usd" else _tokens
        return (
            f"run budget exceeded for run {self.run_id!r}: {amount(self.spent)} spent and "
            f"{amount(self.reserved)} held by calls in flight, of a limit of "
            f"{amount(self.limit)}; this call needs about {amount(self.requested)} more "
            "(its estimate), so it was not sent. Raise the run's limit "
            "(tokenfuse.run(..., tokens=..., usd=...)) or end the run"
        )

    def as_dict(self) -> dict[str, object]:
        found = super().as_dict()
        found.update(
            run_id=self.run_id, spent=self.spent, reserved=self.reserved, requested=self.requested
        )
        return found


def _usd(value: float) -> str:
    return f"${value:,.4f}" if value < 1 else f"${value:,.2f}"


def _tokens(value: float) -> str:
    return f"{_fmt(value)} tokens"
