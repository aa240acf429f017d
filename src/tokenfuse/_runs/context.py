"""``tokenfuse.run(...)``: the run a block of code spends for, and the runs bound right now.

The bound runs are a context variable, so asyncio tasks created inside the block, and threads
started with ``contextvars.copy_context().run``, count against the run too; a plain
``threading.Thread`` does not inherit context variables (Python's rule, not ours). Runs nest:
an inner run is added to the outer ones, and a call reserves against each of them.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple

from .._core.budget import NO_LIMIT, RunState, RunVerdict
from .._errors import ConfigurationError, FuseTripped
from .._events import EventKind, FuseEvent, logger
from .._stores.ops import OpenRun, ReadRun
from . import pricing

if TYPE_CHECKING:
    from .._fuse import Fuse

__all__ = [
    "DEFAULT_CALL_ESTIMATE",
    "DEFAULT_RUN_TTL",
    "RUN_HEADER",
    "Bound",
    "Run",
    "RunAmounts",
    "bind_run_id",
    "bound_runs",
    "checked_run_id",
]

#: The header that carries the run id to the services an agent calls (``FuseTransport`` sends
#: it from inside a run; the inbound middleware binds the run it names).
RUN_HEADER = "TokenFuse-Run"
#: Seconds a run's state lives after its last write.
DEFAULT_RUN_TTL = 86_400.0
#: Output tokens reserved for a call that names no maximum (``max_tokens`` and the like).
DEFAULT_CALL_ESTIMATE = 4_096.0

# What a run id may look like: it comes from code, or from a header (untrusted), and shows
# in messages and events; it reaches the store only as a keyed hash.
_RUN_ID = re.compile(r"^[A-Za-z0-9_.:@/+=-]{1,128}$")


def checked_run_id(run_id: object) -> str | None:
    """The run id if it is one (1-128 characters of ``A-Za-z0-9_.:@/+=-``), else None."""
    if isinstance(run_id, str) and _RUN_ID.match(run_id):
        return run_id
    return None


class RunAmounts(NamedTuple):
    """Tokens and US dollars; None for a unit the run has no limit in (``remaining``)."""

    tokens: float | None
    usd: float | None


@dataclass(frozen=True, slots=True)
class Bound:
    """One run the current context spends for.

    ``fuse`` is the fuse whose store holds the run (None: a run joined by id from an inbound
    header, kept in the store of whichever fuse guards the call); ``handle`` is the ``Run``
    whose ``spent`` the settlements refresh.
    """

    run_id: str
    ttl: float
    call_estimate: float
    fuse: Fuse | None = None
    handle: Run | None = None


_bound: ContextVar[tuple[Bound, ...]] = ContextVar("tokenfuse_runs", default=())


def bound_runs() -> tuple[Bound, ...]:
    """The runs bound around the caller, outermost first (empty: none)."""
    return _bound.get()


@contextmanager
def bind_run_id(run_id: str) -> Iterator[Bound]:
    """Join the run ``run_id`` (already checked) for the block: the inbound middleware's way
    of counting a tool server's own LLM calls against its caller's run."""
    bound = Bound(run_id, DEFAULT_RUN_TTL, DEFAULT_CALL_ESTIMATE)
    runs = _bound.get()
    if any(each.run_id == run_id for each in runs):  # bound already (the caller's process)
        yield bound
        return
    token = _bound.set((*runs, bound))
    try:
        yield bound
    finally:
        _bound.reset(token)


def _limit(value: float | None, name: str) -> float:
    if value is None:
        return NO_LIMIT
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigurationError(f"run {name} limit must be a non-negative number, not {value!r}")
    if math.isinf(value):
        return NO_LIMIT
    return float(value)


class Run:
    """A run budget: every guarded LLM call made inside the block counts against it.

    >>> with tokenfuse.run("run-123", tokens=200_000, usd=5.0) as run:   # doctest: +SKIP
    ...     agent.invoke(...)
    ...     print(run.spent, run.remaining)

    Without limits, ``tokenfuse.run("run-123")`` *joins* the run: the limits it was opened
    with elsewhere (another process sharing the store) apply, and its calls count there.

    Args:
        run_id: the run's name (1-128 characters of ``A-Za-z0-9_.:@/+=-``); it is shown in
            refusals and events, and stored only as a keyed hash.
        tokens, usd: the limits (None: none in that unit). A ``usd`` limit needs prices:
            ``pip install 'tokenfuse[prices]'`` or ``tokenfuse.guards.set_prices``.
        ttl: seconds the run's state lives after its last write.
        fuse: the fuse whose store holds the run (default: ``default_fuse()``, the one
            argument-less transports use). Transports given a fuse of their own reserve in
            this one's store all the same.
        call_estimate: output tokens reserved for a call whose request names no maximum.
    """

    def __init__(
        self,
        run_id: str,
        *,
        tokens: float | None = None,
        usd: float | None = None,
        ttl: float = DEFAULT_RUN_TTL,
        fuse: Fuse | None = None,
        call_estimate: float = DEFAULT_CALL_ESTIMATE,
    ) -> None:
        checked = checked_run_id(run_id)
        if checked is None:
            raise ConfigurationError(
                f"a run id is 1-128 characters of A-Za-z0-9_.:@/+=-, not {run_id!r}"
            )
        if not (isinstance(ttl, (int, float)) and 0 < ttl < math.inf):
            raise ConfigurationError(f"run ttl must be a positive number of seconds, not {ttl!r}")
        if not (isinstance(call_estimate, (int, float)) and 0 <= call_estimate < math.inf):
            raise ConfigurationError(f"call_estimate must be a number of tokens: {call_estimate!r}")
        self.id = checked
        self.token_limit = _limit(tokens, "tokens")
        self.usd_limit = _limit(usd, "usd")
        if self.usd_limit >= 0 and not pricing.has_prices():
            raise ConfigurationError(
                "a usd limit needs model prices: pip install 'tokenfuse[prices]' (the "
                "genai-prices table), or give your own with tokenfuse.guards.set_prices(...)"
            )
        self.join = tokens is None and usd is None
        self.ttl = float(ttl)
        self.call_estimate = float(call_estimate)
        self._fuse = fuse
        self._token: Token[tuple[Bound, ...]] | None = None
        #: The run's state as last seen (at entry, and after every call it settled).
        self.last: RunState | None = None

    def __repr__(self) -> str:
        return f"Run({self.id!r})"

    @property
    def fuse(self) -> Fuse:
        if self._fuse is None:
            from .._fuse import default_fuse

            self._fuse = default_fuse()
        return self._fuse

    # -- entering and leaving ---------------------------------------------------------------

    def _open_op(self) -> OpenRun:
        key = self.fuse.run_key(self.id)
        return OpenRun(key, self.token_limit, self.usd_limit, self.ttl, join=self.join)

    def __enter__(self) -> Run:
        results = self.fuse.run_guarded([self._open_op()])
        self._opened(results[0] if results else None)
        return self

    async def __aenter__(self) -> Run:
        results = await self.fuse.arun_guarded([self._open_op()])
        self._opened(results[0] if results else None)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._leave()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._leave()

    def _opened(self, verdict: RunVerdict | None) -> None:
        if verdict is not None:
            self.last = verdict.state
            if self.join and verdict.state.token_limit < 0 and verdict.state.usd_limit < 0:
                logger.info("tokenfuse: run %r has no limits (yet): its calls are counted", self.id)
        if self._token is not None:
            raise ConfigurationError(f"run {self.id!r} is entered already")
        bound = Bound(self.id, self.ttl, self.call_estimate, self.fuse, self)
        self._token = _bound.set((*_bound.get(), bound))

    def _leave(self) -> None:
        if self._token is not None:
            _bound.reset(self._token)
            self._token = None

    # -- what it spent --------------------------------------------------------------------------

    def read(self) -> RunState | None:
        """The run's state in the store (None: no such run); the last one seen when the store
        cannot be read now (down, or async-only)."""
        if self.fuse.has_sync:
            results = self.fuse.run_guarded([ReadRun(self.fuse.run_key(self.id))])
            if results is not None:
                self.last = results[0]
        return self.last

    async def aread(self) -> RunState | None:
        """``read`` for asyncio code."""
        results = await self.fuse.arun_guarded([ReadRun(self.fuse.run_key(self.id))])
        if results is not None:
            self.last = results[0]
        return self.last

    @property
    def spent(self) -> RunAmounts:
        """Tokens and US dollars the run's finished calls spent (a store read)."""
        state = self.read()
        if state is None:
            return RunAmounts(0.0, 0.0)
        return RunAmounts(state.spent_tokens, state.spent_usd)

    @property
    def remaining(self) -> RunAmounts:
        """What new calls may still reserve, per unit: the limit less what was spent and what
        calls in flight hold; None for a unit without a limit (a store read)."""
        state = self.read()
        if state is None:
            return RunAmounts(None, None)
        return remaining_of(state)


def remaining_of(state: RunState) -> RunAmounts:
    tokens = usd = None
    if state.token_limit >= 0:
        tokens = max(state.token_limit - state.spent_tokens - state.reserved_tokens, 0.0)
    if state.usd_limit >= 0:
        usd = max(state.usd_limit - state.spent_usd - state.reserved_usd, 0.0)
    return RunAmounts(tokens, usd)


def run_event(
    fuse: Fuse, kind: EventKind, run_id: str, detail: str, error: FuseTripped | None = None
) -> None:
    """Report a run's event through the fuse's hooks (and the process's listeners)."""
    event = FuseEvent(kind, run_id, detail, error, at=time.time(), fuse=fuse.name)
    fuse.hooks.emit(event, logging.WARNING)
