"""The guards that run beside the velocity check: run budgets (``run``) and the failure-loop
breaker (``FailureLoopPolicy``, on by default in every ``FuseTransport`` and middleware).

A run budget caps what one workflow run spends, across every subagent, thread, task and
process sharing it::

    with tokenfuse.run("run-123", tokens=200_000, usd=5.0) as run:
        orchestrate()                       # every guarded LLM call inside counts
    print(run.spent, run.remaining)

A stuck agent's failing call, repeated, is refused with ``FailureLoop``; ``forget_loops(error)``
lets it through again. docs/guards.md in the repository describes each guard.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._core.budget import RunState
from ._errors import BudgetExceeded, FailureLoop
from ._loops import FailureLoopPolicy, aforget_loops, forget_loops
from ._runs.context import (
    DEFAULT_CALL_ESTIMATE,
    DEFAULT_RUN_TTL,
    RUN_HEADER,
    Run,
    RunAmounts,
)
from ._runs.context import (
    bound_runs as _bound_runs,
)
from ._runs.pricing import Price, set_prices

if TYPE_CHECKING:
    from ._fuse import Fuse

__all__ = [
    "DEFAULT_CALL_ESTIMATE",
    "DEFAULT_RUN_TTL",
    "RUN_HEADER",
    "BudgetExceeded",
    "FailureLoop",
    "FailureLoopPolicy",
    "Price",
    "Run",
    "RunAmounts",
    "RunState",
    "aforget_loops",
    "current_runs",
    "forget_loops",
    "run",
    "set_prices",
]


def run(
    run_id: str,
    *,
    tokens: float | None = None,
    usd: float | None = None,
    ttl: float = DEFAULT_RUN_TTL,
    fuse: Fuse | None = None,
    call_estimate: float = DEFAULT_CALL_ESTIMATE,
) -> Run:
    """A run budget, to enter with ``with`` or ``async with`` (``Run`` has the details).

    >>> with run("run-123", tokens=200_000, usd=5.0):   # doctest: +SKIP
    ...     agent.invoke(...)
    >>> with run("run-123"):                             # doctest: +SKIP
    ...     subagent.invoke(...)        # joins the run opened elsewhere, with its limits
    """
    return Run(run_id, tokens=tokens, usd=usd, ttl=ttl, fuse=fuse, call_estimate=call_estimate)


def current_runs() -> tuple[str, ...]:
    """The ids of the runs bound around the caller, outermost first."""
    return tuple(bound.run_id for bound in _bound_runs())
