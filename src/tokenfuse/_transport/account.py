"""Telling a fuse about calls whose usage was not read whole: counted, and reported at a pace.

A call is counted in ``fuse.stats`` when its usage was estimated, unknown or partial. The
first call of each kind is reported at once, as a ``FuseEvent`` to the fuse's hooks and a log
line, and then at most once per ``fuse.stats.report_every`` seconds with how many calls there
were: a provider that never reports usage is visible all along, without a line per call.
"""

from __future__ import annotations

import logging

from .._events import EventKind, FuseEvent
from .._fuse import Fuse
from .._identity import Identity
from .._stats import Outcome
from .._usage import Usage
from .._usage.estimate import BYTES_PER_TOKEN

__all__ = ["account", "outcome_of"]

_KINDS: dict[Outcome, tuple[EventKind, int]] = {
    "estimated": ("usage_estimated", logging.WARNING),
    "unknown": ("usage_unknown", logging.WARNING),
    # A client that stops reading early is normal; what it had reported was recorded.
    "partial": ("usage_partial", logging.INFO),
}


def outcome_of(usage: Usage | None) -> Outcome | None:
    """What happened to a call's usage, or None when it was read whole (or counts nothing)."""
    if usage is None or usage.counts_nothing:
        return None
    if usage.total is None:
        return "unknown"
    if usage.estimated:
        return "estimated"
    return "partial" if usage.partial else None


def account(fuse: Fuse, identity: Identity, usage: Usage | None, *, estimating: bool) -> None:
    """Count the call in ``fuse.stats`` if its usage was not read whole; report when due."""
    outcome = outcome_of(usage)
    if outcome is None or usage is None:
        return
    due = fuse.stats.count(identity, outcome)
    if due is None:
        return
    total, new = due
    kind, level = _KINDS[outcome]
    detail = _detail(outcome, usage, estimating)
    key_id = fuse.key_id(identity)
    latest = (
        f"the latest: key {identity.label} [id {key_id}], {usage.provider}: "
        f"{usage.problem or 'no detail'}"
    )
    message = f"{detail} ({total} so far, {new} since the last report); {latest}"
    fuse.hooks.emit(FuseEvent(kind, identity.label, message, key_id=key_id), level)


def _detail(outcome: Outcome, usage: Usage, estimating: bool) -> str:
    if outcome == "estimated":
        return (
            f"calls reported no usage and were recorded as estimates ({usage.total:,.0f} "
            f"tokens for the latest, at {BYTES_PER_TOKEN} bytes of text a token)"
        )
    if outcome == "unknown":
        hint = "" if estimating else "; FuseTransport(estimate=True) records an estimate instead"
        return f"calls reported no usage that could be counted and were recorded as nothing{hint}"
    return (
        "responses ended before their usage was complete and were recorded as far as they "
        f"reported ({usage.total:,.0f} tokens for the latest)"
    )
