"""Run budgets: how much one workflow run may spend, shared by every call made inside it.

A run has up to two limits, in tokens and in US dollars (``-1`` = no limit in that unit). It
keeps what its finished calls spent and what its calls in flight have *reserved*. A call
reserves its estimate before it is sent and is refused when ``spent + reserved + estimate``
would pass a limit; when its usage is known it *settles*: the reservation is replaced by the
real amount (which may be larger: the estimate is a guess, the bill is not). A call that fails
settles with nothing (``release``). So concurrent callers never overspend by more than what
their own estimates missed (docs/guards.md#run-budgets states the bound).

Pure: functions of (state, amounts, now) that update the state they are given and return a
verdict, mirrored line for line by ``_stores/lua/_budget.lua``. A run's state expires ``ttl``
seconds after its last write (every write refreshes it), so abandoned runs disappear.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "NEAR_FRACTION",
    "NO_LIMIT",
    "RunState",
    "RunVerdict",
    "live",
    "new_run",
    "open_run",
    "release",
    "reserve",
    "settle",
]

#: A limit of -1 means none in that unit.
NO_LIMIT = -1.0
#: The share of a limit whose crossing fires ``budget_near`` (once per run).
NEAR_FRACTION = 0.8


@dataclass(slots=True)
class RunState:
    """One run's limits and spending, of a fixed size however many calls it makes.

    ``near_alerted`` and ``exceeded_alerted`` (0 or 1) make the ``budget_near`` and
    ``budget_exceeded`` events fire once per run, in whichever process sees the crossing.
    """

    token_limit: float = NO_LIMIT
    usd_limit: float = NO_LIMIT
    spent_tokens: float = 0.0
    spent_usd: float = 0.0
    reserved_tokens: float = 0.0
    reserved_usd: float = 0.0
    expires: float = 0.0
    near_alerted: float = 0.0
    exceeded_alerted: float = 0.0


@dataclass(slots=True)
class RunVerdict:
    """The outcome of one step on a run.

    ``allowed`` is False when a reservation was refused; ``unit`` then names the limit it
    would have passed (``"tokens"`` or ``"usd"``). ``near`` and ``exceeded`` are True for the
    one step that first crossed 80 % of a limit, or first went over (or was refused by) one:
    what the events report. ``state`` is the run's state after the step (a copy in stores).
    """

    allowed: bool
    state: RunState
    unit: str | None = None
    near: bool = False
    exceeded: bool = False


def new_run(now: float, ttl: float, token_limit: float, usd_limit: float) -> RunState:
    return RunState(token_limit=token_limit, usd_limit=usd_limit, expires=now + ttl)


def live(state: RunState | None, now: float) -> RunState | None:
    """The state unless it has expired (a store may still hold an expired one)."""
    if state is None or state.expires <= now:
        return None
    return state


def open_run(
    state: RunState | None,
    now: float,
    ttl: float,
    token_limit: float,
    usd_limit: float,
    join: bool,
) -> RunState:
    """Open the run with these limits, or ``join`` it: keep the limits it has (a run nobody
    opened yet is joined with none). What it spent is kept either way."""
    state = live(state, now)
    if state is None:
        return new_run(now, ttl, token_limit, usd_limit)
    if not join:
        state.token_limit = token_limit
        state.usd_limit = usd_limit
    state.expires = now + ttl
    return state


def _over(spent: float, reserved: float, amount: float, limit: float) -> bool:
    return limit >= 0 and spent + reserved + amount > limit


def _near(state: RunState) -> bool:
    """Whether spending (settled) has reached NEAR_FRACTION of a limit."""
    tokens = state.token_limit >= 0 and state.spent_tokens >= NEAR_FRACTION * state.token_limit
    usd = state.usd_limit >= 0 and state.spent_usd >= NEAR_FRACTION * state.usd_limit
    return tokens or usd


def _alerts(state: RunState, verdict: RunVerdict) -> RunVerdict:
    """Mark the first near and the first exceeded crossing of the run."""
    if state.near_alerted == 0 and _near(state):
        state.near_alerted = 1.0
        verdict.near = True
    exceeded = not verdict.allowed or (
        (state.token_limit >= 0 and state.spent_tokens > state.token_limit)
        or (state.usd_limit >= 0 and state.spent_usd > state.usd_limit)
    )
    if state.exceeded_alerted == 0 and exceeded:
        state.exceeded_alerted = 1.0
        verdict.exceeded = True
    return verdict


def _not_below_zero(value: float) -> float:
    return 0.0 if value < 0 else value


def reserve(state: RunState, now: float, ttl: float, tokens: float, usd: float) -> RunVerdict:
    """Hold ``tokens`` and ``usd`` for a call about to be sent, or refuse it (nothing held)
    when either would take the run past its limit."""
    state.expires = now + ttl
    unit = None
    if _over(state.spent_tokens, state.reserved_tokens, tokens, state.token_limit):
        unit = "tokens"
    elif _over(state.spent_usd, state.reserved_usd, usd, state.usd_limit):
        unit = "usd"
    if unit is not None:
        return _alerts(state, RunVerdict(allowed=False, state=state, unit=unit))
    state.reserved_tokens = state.reserved_tokens + tokens
    state.reserved_usd = state.reserved_usd + usd
    return _alerts(state, RunVerdict(allowed=True, state=state))


def settle(
    state: RunState,
    now: float,
    ttl: float,
    held_tokens: float,
    held_usd: float,
    tokens: float,
    usd: float,
) -> RunVerdict:
    """Replace a reservation (``held_*``) by what the call really spent (``tokens``, ``usd``;
    0 and 0 release it). A reservation is never returned below zero: a run that expired and
    was opened again in between does not go negative."""
    state.expires = now + ttl
    state.reserved_tokens = _not_below_zero(state.reserved_tokens - held_tokens)
    state.reserved_usd = _not_below_zero(state.reserved_usd - held_usd)
    state.spent_tokens = state.spent_tokens + tokens
    state.spent_usd = state.spent_usd + usd
    return _alerts(state, RunVerdict(allowed=True, state=state))


def release(state: RunState, now: float, ttl: float, tokens: float, usd: float) -> RunVerdict:
    """Give a reservation back: the call failed before it spent anything."""
    return settle(state, now, ttl, tokens, usd, 0.0, 0.0)
