"""Inbound: how a handler tells the middleware what a call spent (``count="tokens"``).

Two ways, both summed:

* a response header, ``TokenFuse-Tokens: 1234``, which the middleware reads and strips before
  the response leaves the server (no framework import needed, works for any app);
* ``report_tokens(1234)`` anywhere inside the handler, also from a streaming body or a worker
  thread of the request; pass ``request=`` (a Starlette or Flask request, a scope, an environ)
  when the call happens outside the request's context.

The amount is recorded after the response is complete, so it is judged for the *next* call:
the same flow as the outbound transport (a call that trips still gets its response).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from .request import mapping_of

__all__ = [
    "DECISION_KEY",
    "MAX_REPORT",
    "REPORT_KEY",
    "TOKENS_HEADER",
    "Report",
    "parse_amount",
    "report_tokens",
]

logger = logging.getLogger("tokenfuse.middleware")

#: Scope / environ key holding the request's ``Report``.
REPORT_KEY = "tokenfuse.report"
#: Scope / environ key holding the request's ``Decision`` (useful in shadow mode).
DECISION_KEY = "tokenfuse.decision"
#: The response header a handler may set instead of calling ``report_tokens``.
TOKENS_HEADER = "TokenFuse-Tokens"

#: No single call spends a trillion of anything: a bigger report is corruption, not spending.
MAX_REPORT = 1e12

_current: ContextVar[Report | None] = ContextVar("tokenfuse_report", default=None)


def _valid(amount: object) -> float | None:
    if isinstance(amount, bool) or not isinstance(amount, (int, float)):
        return None
    value = float(amount)
    return value if 0 < value <= MAX_REPORT else None  # NaN fails both comparisons


class Report:
    """The amounts reported during one request. Appends are atomic: no lock needed."""

    __slots__ = ("_amounts",)

    def __init__(self) -> None:
        self._amounts: list[float] = []

    def add(self, amount: object) -> bool:
        value = _valid(amount)
        if value is None:
            return False
        self._amounts.append(value)
        return True

    @property
    def total(self) -> float:
        return sum(self._amounts)

    @contextmanager
    def active(self) -> Iterator[None]:
        """Within the block, ``report_tokens`` without ``request=`` adds to this report."""
        token = _current.set(self)
        try:
            yield
        finally:
            _current.reset(token)


def parse_amount(raw: str | bytes) -> float | None:
    """A header value as an amount; malformed, negative, non-finite or absurd values are None."""
    if len(raw) > 64:
        return None
    try:
        return _valid(float(raw))
    except ValueError:
        return None


def report_tokens(amount: float, request: object | None = None) -> bool:
    """Add ``amount`` to what the current guarded request spent.

    Returns False (and records nothing) when no guarded request is found or the amount is not
    a positive finite number.

    >>> @app.post("/tools/summarize")                      # doctest: +SKIP
    ... async def summarize(body: Doc) -> Summary:
    ...     result = await llm(body)
    ...     report_tokens(result.usage.total_tokens)
    ...     return result.summary
    """
    report = _current.get()
    if request is not None:
        raw = mapping_of(request)
        found = raw.get(REPORT_KEY) if raw is not None else None
        report = found if isinstance(found, Report) else None
    if report is None:
        logger.debug("report_tokens(%r) outside a request guarded with count='tokens'", amount)
        return False
    return report.add(amount)
