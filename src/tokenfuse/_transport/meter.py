"""The sans-IO half of the transport: one call's report, and its usage reader made safe.

Both transports (sync and async) and both stream wrappers drive a ``Meter``; only the store
call that records the amount differs between them, and it lives in their thin shells.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from .._events import logger
from .._fuse import Decision
from .._identity import Identity
from .._usage import Usage, UsageReader

__all__ = ["FuseReport", "Meter", "log_once"]

_MAX_LOGGED = 256
_UNKNOWN = "unknown"
_logged: set[tuple[str, str]] = set()


def log_once(provider: str, problem: str, exc: BaseException | None = None) -> None:
    """Log a usage problem the first time it is seen in this process.

    A provider that never sends usage (an OpenAI stream without ``include_usage``) would
    otherwise log on every call. The set is bounded: problems past the first few hundred
    distinct ones are no longer logged at all.
    """
    marker = (provider, problem)
    if marker in _logged or len(_logged) >= _MAX_LOGGED:
        return
    _logged.add(marker)
    logger.log(
        logging.WARNING,
        "tokenfuse could not count the tokens of a response (provider: %s): %s. It is recorded "
        "as unknown; further occurrences are not logged.",
        provider,
        problem,
        exc_info=exc,
    )


@dataclass(slots=True, eq=False)
class FuseReport:
    """What the transport did with one call, in ``response.extensions["tokenfuse"]``.

    A streamed response is returned before its body is read: ``usage`` and ``record`` are
    filled in when the stream ends or is closed (``done`` turns True).

    >>> report = response.extensions["tokenfuse"]        # doctest: +SKIP
    >>> report.key, report.usage.total, report.decision.rate  # doctest: +SKIP
    ('sk-…a1b2', 1234.0, 5821.0)
    >>> fuse.status(report.identity).rate                  # doctest: +SKIP
    5821.0

    Attributes:
        identity: who the call was counted for (``fuse.status(report.identity)``);
            ``key`` is its redacted label.
        gate: the decision taken before sending (always allowed here: a refusal raises).
        usage: the tokens read from the response; ``None`` while a stream is still being read
            and for responses that are not LLM calls (no reader matched them).
            ``usage.total is None`` means the amount is unknown (nothing was recorded).
        record: the decision of recording the usage; ``None`` when nothing was recorded
            (unknown usage, a count of 0, or not finished yet).
        done: the response has been read or closed and its usage settled.
    """

    identity: Identity
    gate: Decision
    usage: Usage | None = None
    record: Decision | None = None
    done: bool = False

    @property
    def key(self) -> str:
        """The redacted label of the identity (``sk-…a1b2``, ``agent-42``)."""
        return self.identity.label

    @property
    def decision(self) -> Decision:
        """The latest decision: the record's once made, else the gate's."""
        return self.record if self.record is not None else self.gate

    @property
    def tripped(self) -> bool:
        """This call's usage opened the key: the next call from it will be refused."""
        return self.record is not None and self.record.tripped


class Meter:
    """Feeds one response's bytes to its reader and settles the result exactly once.

    Nothing here raises: a reader that fails is logged once, dropped, and the call's usage
    becomes unknown. ``feed`` does no more than hand the chunk over, so it never delays it.
    """

    __slots__ = ("_failure", "_reader", "identity", "report")

    def __init__(self, identity: Identity, report: FuseReport, reader: UsageReader | None) -> None:
        self.identity = identity
        self.report = report
        self._reader = reader
        self._failure: str | None = None

    @property
    def reading(self) -> bool:
        """A reader is looking at the body (False: not an LLM call, or its reader failed)."""
        return self._reader is not None

    def read_with(self, reader: UsageReader | None) -> None:
        self._reader = reader

    def feed(self, chunk: bytes) -> None:
        reader = self._reader
        if reader is None:
            return
        try:
            reader.feed(chunk)
        except Exception as exc:
            self.fail(exc)

    def feeder(self) -> Callable[[bytes], None]:
        """What a stream calls with every chunk: the reader's own ``feed`` (the usage side's
        readers never raise), or ``feed`` when there is none, one call layer less."""
        reader = self._reader
        return reader.feed if reader is not None else self.feed

    def finish(self, *, complete: bool) -> float | None:
        """End the reading: the amount to record, or None (nothing to record, or done before)."""
        report = self.report
        if report.done:
            return None
        report.done = True
        usage = self._usage(complete)
        report.usage = usage
        if usage is None:
            return None
        if usage.problem is not None and not usage.counts_nothing:
            log_once(usage.provider, usage.problem)
        total = usage.total
        return total if total is not None and total > 0 else None

    def recorded(self, decision: Decision) -> None:
        self.report.record = decision

    def _usage(self, complete: bool) -> Usage | None:
        reader = self._reader
        if reader is None:
            if self._failure is None:
                return None  # not an LLM call: nothing was read
            return Usage.unknown(_UNKNOWN, self._failure, partial=not complete)
        self._reader = None
        try:
            return reader.finish(complete=complete)
        except Exception as exc:
            self.fail(exc)
            return Usage.unknown(_UNKNOWN, self._failure or "reader failed")

    def fail(self, exc: Exception) -> None:
        """The reader (or choosing one) failed: log once, read no more, report unknown."""
        self._reader = None
        self._failure = f"usage reader failed: {type(exc).__name__}"
        log_once(_UNKNOWN, self._failure, exc)
