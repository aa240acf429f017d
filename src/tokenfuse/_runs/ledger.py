"""Reserving a call against every run bound around it, all or nothing, and settling it.

A call made inside nested runs reserves against each of them. The runs' keys live in
different slots of a Redis Cluster, so no one script can hold them all: the reservations go
as one pipeline (one round trip, one script per run, each atomic on its own key), and if any
run refuses, the reservations the others granted are given back at once (a second round
trip, only on a refusal). Between the two, a call on an outer run may see it fuller than it
will be: that errs toward refusing, never toward overspending.

The store failing fails open, as every decision does (``Fuse.run_guarded``): the call goes
on unreserved, counted and reported, and its settlement still counts what it spent if the
store is back by then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._core.budget import RunState, RunVerdict
from .._errors import BudgetExceeded, _tokens, _usd
from .._stores.ops import Op, Reserve, Settle
from .context import Bound, run_event

if TYPE_CHECKING:
    from .._fuse import Fuse

__all__ = ["Hold", "hold_for"]


@dataclass(slots=True)
class _Group:
    """The bound runs kept in one fuse's store, and what this call holds on each."""

    fuse: Fuse
    runs: list[Bound]
    keys: list[str]
    held: list[bool] = field(default_factory=list)


@dataclass(slots=True)
class Hold:
    """What one call reserved, on which runs: settled or released exactly once."""

    groups: list[_Group]
    tokens: float
    """The call's estimate; 0 when it does not look like an LLM call (nothing reserved)."""
    usd: float
    done: bool = False
    model: str | None = None
    priced: bool = False
    """Whether a run of the call may have a dollar limit (an unknown price then matters)."""

    # -- reserving ------------------------------------------------------------------------

    def reserve_ops(self, group: _Group) -> list[Op[Any]]:
        return [
            Reserve(key, self.tokens, self.usd, run.ttl)
            for run, key in zip(group.runs, group.keys, strict=True)
        ]

    def judge(
        self, results: list[list[Any] | None]
    ) -> tuple[BudgetExceeded | None, list[tuple[Fuse, list[Op[Any]]]]]:
        """The refusal (None: every run granted it), and per group the releases owed when one
        refused: the reservations the other runs granted."""
        refusal: BudgetExceeded | None = None
        for group, verdicts in zip(self.groups, results, strict=True):
            if verdicts is None:  # the store failed: nothing held there, the call goes on
                group.held = [False] * len(group.runs)
                continue
            group.held = [verdict.allowed for verdict in verdicts]
            for run, verdict in zip(group.runs, verdicts, strict=True):
                _report(group.fuse, run, verdict, self)
                if not verdict.allowed:
                    refusal = _refusal(run, verdict, self)  # the innermost refusing run wins
        return refusal, self.releases() if refusal is not None else []

    def releases(self) -> list[tuple[Fuse, list[Op[Any]]]]:
        """The ops that give back every reservation held (the call will not be sent), per
        store; nothing is held afterwards."""
        releases: list[tuple[Fuse, list[Op[Any]]]] = []
        for group in self.groups:
            ops: list[Op[Any]] = [
                Settle(key, self.tokens, self.usd, 0.0, 0.0, run.ttl)
                for run, key, held in zip(group.runs, group.keys, group.held, strict=True)
                if held
            ]
            group.held = [False] * len(group.runs)
            if ops:
                releases.append((group.fuse, ops))
        return releases

    # -- settling --------------------------------------------------------------------------

    def holds_any(self) -> bool:
        return any(any(group.held) for group in self.groups)

    def settle_ops(self, group: _Group, tokens: float, usd: float) -> list[Op[Any]]:
        return [
            Settle(
                key,
                self.tokens if held else 0.0,
                self.usd if held else 0.0,
                tokens,
                usd,
                run.ttl,
            )
            for run, key, held in zip(group.runs, group.keys, group.held, strict=True)
        ]

    def settled(self, group: _Group, verdicts: list[RunVerdict] | None) -> None:
        if verdicts is None:
            return
        for run, verdict in zip(group.runs, verdicts, strict=True):
            _report(group.fuse, run, verdict, self)


def hold_for(runs: tuple[Bound, ...], fuse: Fuse, tokens: float, usd: float) -> Hold:
    """The hold of a call by ``fuse``'s transport on ``runs``, grouped by the store of each."""
    groups: dict[int, _Group] = {}
    for run in runs:
        owner = run.fuse or fuse
        group = groups.get(id(owner.store))  # one pipeline per store
        if group is None:
            group = groups[id(owner.store)] = _Group(owner, [], [])
        key = owner.run_key(run.run_id)
        if key in group.keys:
            continue  # bound twice (a run joined by header inside itself): counted once
        group.runs.append(run)
        group.keys.append(key)
        group.held.append(False)  # nothing held until a reservation is granted
    return Hold(list(groups.values()), tokens, usd)


def _refusal(run: Bound, verdict: RunVerdict, hold: Hold) -> BudgetExceeded:
    state = verdict.state
    usd = verdict.unit == "usd"
    return BudgetExceeded(
        run_id=run.run_id,
        spent=state.spent_usd if usd else state.spent_tokens,
        limit=state.usd_limit if usd else state.token_limit,
        unit="usd" if usd else "tokens",
        reserved=state.reserved_usd if usd else state.reserved_tokens,
        requested=hold.usd if usd else hold.tokens,
        retry_after=run.ttl,  # the refusal refreshed the run's expiry: it lasts this long
    )


def _report(fuse: Fuse, run: Bound, verdict: RunVerdict, hold: Hold) -> None:
    """The run's events of this step, and its handle's latest state."""
    state = verdict.state
    if run.handle is not None:
        run.handle.last = state
    if verdict.near:
        run_event(fuse, "budget_near", run.run_id, f"run {run.run_id!r} {_use(state)}")
    if verdict.exceeded:
        if verdict.allowed:
            detail = f"run {run.run_id!r} went over its budget: {_use(state)}"
            run_event(fuse, "budget_exceeded", run.run_id, detail)
        else:
            error = _refusal(run, verdict, hold)
            run_event(fuse, "budget_exceeded", run.run_id, str(error), error)


def _use(state: RunState) -> str:
    parts = []
    if state.token_limit >= 0:
        parts.append(f"{_tokens(state.spent_tokens)} of {_tokens(state.token_limit)}")
    if state.usd_limit >= 0:
        parts.append(f"{_usd(state.spent_usd)} of {_usd(state.usd_limit)}")
    return "has spent " + " and ".join(parts)
